"""The cost model against numbers worked out by hand (see costmodel's docstring)."""

from __future__ import annotations

import pytest

from geotrain.errors import InfeasiblePlanError, ScenarioError
from geotrain.planner import CostModel, Scenario, StageAssignment, evaluate
from tests.planner.helpers import link, peer, scenario


def _two_regions(**job):
    return Scenario.from_dict(scenario(
        [peer("a", "r1", usd=1.0), peer("b", "r2", usd=2.0)],
        [link("r1", "r2", 0.8, 10.0)],
        regions={"r1": 0.01, "r2": 0.05},
        **job,
    ))


def test_one_pipeline_two_stages_exact():
    sc = _two_regions()
    pipes = [[StageAssignment("a", (0, 2)), StageAssignment("b", (2, 4))]]
    p = evaluate(sc, pipes)
    # C = 100 tok x 2e9 FLOP / 1e12 FLOP/s = 0.2 s per stage; hop: 2 x 1e5 B / 1e8 B/s = 2 ms busy + 10 ms RTT.
    # Two stages hold two microbatches in their loop: period max(0.2, 0.002, (0.2 + 0.012 + 0.2) / 2) = 0.206
    step = 0.2 + 0.2 + 0.002 + 0.010 + 3 * 0.206
    assert p.step_s == pytest.approx(step, rel=1e-12)
    assert p.pipeline_step_s == pytest.approx(step, rel=1e-12)
    assert p.tokens_per_s == pytest.approx(4 * 100 / step, rel=1e-12)
    assert p.bytes_per_region_pair == pytest.approx({("r1", "r2"): 4e5, ("r2", "r1"): 4e5})
    assert p.cross_region_bytes_per_step == pytest.approx(8e5)
    egress_per_step = 4e5 * 0.01 / 1e9 + 4e5 * 0.05 / 1e9
    assert p.usd_per_hour == pytest.approx(3.0 + egress_per_step * 3600 / step, rel=1e-12)
    assert p.usd_per_mtok == pytest.approx(p.usd_per_hour / (p.tokens_per_s * 3600) * 1e6, rel=1e-12)
    assert p.utilisation == pytest.approx({"a": 0.8 / step, "b": 0.8 / step})
    assert p.round_sync_s == 0.0 and p.bottleneck == "round trip a..b"


@pytest.mark.parametrize("overlap, tau, expected_step", [(False, None, 1.7), (True, None, 1.6), (True, 1, 1.6),
                                                         (True, 0, 1.7), (False, 1, 1.7)])
def test_two_pipelines_round_sync_exact(overlap, tau, expected_step):
    # H = 1: the round hides behind tau = overlap_steps inner steps (all H when unset), never when overlap is off
    sc = _two_regions(overlap_sync=overlap, overlap_steps=tau)
    pipes = [[StageAssignment("a", (0, 4))], [StageAssignment("b", (0, 4))]]
    p = evaluate(sc, pipes)
    # group (a, b): 4e6 B of bf16 params = 2e6 fp32 pseudo-gradient elements = 8e6 B;
    # two leaders: 2 x (8e6 / 2) / 1e8 B/s + 2 x 10 ms = 0.1 s; a 1F1B step is 4 x 0.4 s
    assert p.round_sync_s == pytest.approx(0.1, rel=1e-12)
    assert p.pipeline_step_s == pytest.approx(1.6, rel=1e-12)
    assert p.step_s == pytest.approx(expected_step, rel=1e-12)
    assert p.tokens_per_s == pytest.approx(2 * 400 / expected_step, rel=1e-12)
    assert p.bytes_per_region_pair == pytest.approx({("r1", "r2"): 8e6, ("r2", "r1"): 8e6})


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_overlap_steps_must_be_a_count(bad):
    with pytest.raises(ScenarioError, match="overlap_steps"):
        _two_regions(overlap_steps=bad)


def test_stage_memory_exact_and_enforced():
    sc = _two_regions()
    cm = CostModel(sc)
    # 2e6 params x (2 x 2 B + 16 B) + 1 microbatch x 100 tok x 17 x (0 + 3 x 1000 B) of saved inputs
    assert cm.stage_memory(0, 4, 0, 1) == pytest.approx(40e6 + 5.1e6)
    # stage 0 of 2 keeps 2 microbatches in flight: 1e6 x 20 + 2 x 100 x 17 x 1000
    assert cm.stage_memory(0, 2, 0, 2) == pytest.approx(20e6 + 3.4e6)
    small = Scenario.from_dict(scenario([peer("a", "r1", memory_gb=0.04)], []))
    with pytest.raises(InfeasiblePlanError, match="GB"):
        evaluate(small, [[StageAssignment("a", (0, 4))]])
    assert evaluate(small, [[StageAssignment("a", (0, 4))]], check_memory=False).tokens_per_s > 0


@pytest.mark.parametrize(
    "pipes, match",
    [
        ([[StageAssignment("a", (0, 3))]], "covers"),
        ([[StageAssignment("a", (0, 2)), StageAssignment("a", (2, 4))]], "twice"),
        ([[StageAssignment("a", (1, 4))]], "start at 0"),
        ([[StageAssignment("zz", (0, 4))]], "unknown peer"),
        ([], "at least one"),
    ],
)
def test_invalid_plans_are_named(pipes, match):
    with pytest.raises(InfeasiblePlanError, match=match):
        evaluate(_two_regions(), pipes)


def test_missing_link_is_infeasible():
    sc = Scenario.from_dict(scenario([peer("a", "r1"), peer("b", "r2")], []))
    with pytest.raises(InfeasiblePlanError, match="no link"):
        evaluate(sc, [[StageAssignment("a", (0, 2)), StageAssignment("b", (2, 4))]])


def test_activation_codec_shrinks_hop_bytes():
    plain = evaluate(_two_regions(), [[StageAssignment("a", (0, 2)), StageAssignment("b", (2, 4))]])
    int8 = evaluate(_two_regions(activation_codec="int8"),
                    [[StageAssignment("a", (0, 2)), StageAssignment("b", (2, 4))]])
    # bf16 activations -> int8 + one bf16 scale per 256: 2 / (1 + 2/256) of the bytes
    assert plain.cross_region_bytes_per_step / int8.cross_region_bytes_per_step == pytest.approx(2 / (1 + 2 / 256))


def test_tied_embeddings_add_an_end_of_step_exchange():
    d = scenario([peer("a", "r1", usd=1.0), peer("b", "r2", usd=2.0)], [link("r1", "r2", 0.8, 10.0)],
                 regions={"r1": 0.0, "r2": 0.0})
    d["model"]["tied_param_bytes"] = 1_000_000
    pipes = [[StageAssignment("a", (0, 2)), StageAssignment("b", (2, 4))]]
    p = evaluate(Scenario.from_dict(d), pipes)
    # the untied step of test_one_pipeline_two_stages_exact plus 2 x 1e6 B / 1e8 B/s + 10 ms
    assert p.pipeline_step_s == pytest.approx(0.4 + 0.012 + 3 * 0.206 + 0.03, rel=1e-12)
    assert p.bytes_per_region_pair == pytest.approx({("r1", "r2"): 4e5 + 1e6, ("r2", "r1"): 4e5 + 1e6})
    # one stage holds both ends: nothing to exchange
    single = evaluate(Scenario.from_dict(d), [[StageAssignment("a", (0, 4))]])
    assert single.cross_region_bytes_per_step == 0
