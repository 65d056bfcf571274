"""The planner on generated scenarios it was not tuned on: never worse than its baselines, near the optimum."""

from __future__ import annotations

import pytest

from geotrain.errors import InfeasiblePlanError
from geotrain.planner import CostModel, Objective, Scenario, plan
from geotrain.planner.baselines import GeneticConfig
from geotrain.planner.generate import random_scenario, uneven_swarm
from geotrain.planner.search import Scorer, exhaustive, exhaustive_size, heuristic

QUICK_GA = GeneticConfig(population=16, generations=8, stall=4, time_budget_s=2.0)


def test_generator_is_seeded_and_valid():
    assert random_scenario(3) == random_scenario(3)
    assert random_scenario(3) != random_scenario(4)
    for seed in range(20):
        d = random_scenario(seed)
        sc = Scenario.from_dict(d)
        counts = [sum(p.region == r for p in sc.peers) for r in sc.regions]
        assert min(counts) >= 1 and len(sc.peers) == sum(counts)
    # uneven: the failure case's ten cities do not hold equal shares
    counts = sorted(sum(p["region"] == r for p in uneven_swarm(0)["peers"]) for r in uneven_swarm(0)["regions"])
    assert len(counts) == 10 and sum(counts) == 64 and counts[0] < counts[-1]


@pytest.mark.parametrize("seed", range(30))
def test_chosen_plan_is_never_worse_than_any_baseline(seed):
    sc = Scenario.from_dict(random_scenario(seed, max_peers=24))
    try:
        r = plan(sc, genetic=QUICK_GA, time_budget_s=2, moves=600)
    except InfeasiblePlanError:
        return
    obj = r.objective
    for name, p in r.baselines.items():
        if p is not None:
            assert obj.score(r.predicted) <= obj.score(p) + 1e-9 * abs(obj.score(p)), name
        else:
            assert r.baseline_reasons[name]
    assert r.search_predicted is not None
    assert obj.score(r.predicted) <= obj.score(r.search_predicted) + 1e-9 * abs(obj.score(r.search_predicted))


@pytest.mark.parametrize("seed", range(8))
def test_heuristic_within_5_percent_of_exhaustive_on_generated(seed):
    d = random_scenario(1000 + seed, min_peers=3, max_peers=6)
    sc = Scenario.from_dict(d)
    cm = CostModel(sc)
    obj = Objective.parse(d["job"]["objective"])
    ids = sorted(p.id for p in sc.peers)
    if exhaustive_size(cm, len(ids)) > 20_000:
        pytest.skip("too many grids for an exhaustive check")
    opt = exhaustive(Scorer(cm, obj), ids)
    got = heuristic(Scorer(cm, obj), ids, seed=0)
    assert (opt is None) == (got is None)
    if opt is not None and got is not None:
        assert got.score <= opt.score + 0.05 * abs(opt.score)


def test_uneven_swarm_keeps_stage_groups_in_regions():
    """Issue 20's failure: 64 V100s over 10 cities, 8 x 8, a round every step, no codecs.

    The packing used to fill pipelines inside regions and chain the leftovers, so every stage
    group spread over most cities and each round (every step) crossed the world; the layer split
    ignored the rounds. It made 9,153 tokens/s (8,547 on this seed) against the genetic
    baseline's 18,923 (14,436). Stage groups now stay in regions and the split weighs each
    stage's round.
    """
    sc = Scenario.from_dict(uneven_swarm(0))
    r = plan(sc, genetic=QUICK_GA, time_budget_s=10)
    assert r.chosen_from == "search"
    best_baseline = max(p.tokens_per_s for k, p in r.baselines.items() if p is not None and k != "uniform_split")
    assert r.predicted.tokens_per_s >= 1.2 * best_baseline
    assert r.predicted.tokens_per_s > 30_000
    regions_per_group = [len({sc.peer(pipe[s].peer).region for pipe in r.pipelines}) for s in range(8)]
    assert sum(regions_per_group) / 8 <= 2.5


def test_search_keeps_pipelines_in_regions_where_round_trips_set_the_pace():
    """Generated seed 12: 34 T4/RTX 4090 peers in 5 cities, fixed 5 x 6, short stages (8 blocks, 512 tokens).

    A pipeline's round trip sets its pace there, so one hop across cities (233 ms Frankfurt-Tokyo)
    slows it several times. Packing the first 30 peers of a speed order took the 4090s of every city
    and chained them into six pipelines over two or three cities each: 20,029 tokens/s, the genetic
    baseline's 46,152 chosen instead. Whole pipelines are now also picked inside regions from every peer
    (``pack_regions``), and the search's own answer is the best plan.
    """
    sc = Scenario.from_dict(random_scenario(12))
    r = plan(sc, genetic=QUICK_GA, time_budget_s=10)
    assert r.search_predicted is not None and r.baselines["genetic"] is not None
    assert r.search_predicted.tokens_per_s >= r.baselines["genetic"].tokens_per_s / 1.1
    assert r.chosen_from == "search" and r.predicted.tokens_per_s > 40_000
    regions = [len({sc.peer(st.peer).region for st in pipe}) for pipe in r.pipelines]
    assert sum(regions) <= len(r.pipelines) + 1, regions  # at most one pipeline spans two cities


def test_pack_regions_takes_whole_pipelines_inside_regions_from_every_peer():
    from geotrain.planner.search import pack_regions

    # speed ties broken by id scatter the first S x P peers over the regions; pack_regions does not
    d = random_scenario(12)
    sc = Scenario.from_dict(d)
    cm = CostModel(sc)
    order = sorted((p.id for p in sc.peers), key=lambda q: (-sc.peer(q).flops, q))
    grid = pack_regions(cm, order, 5, 6)
    assert len(grid) == 6 and all(len(row) == 5 for row in grid)
    assert len({q for row in grid for q in row}) == 30
    inside = [row for row in grid if len({sc.peer(q).region for q in row}) == 1]
    # tokyo (15 peers) and frankfurt (10) hold five whole pipelines; the sixth is chained from the leftovers
    assert len(inside) == 5
    assert {sc.peer(row[0]).region for row in inside} == {"tokyo", "frankfurt"}
