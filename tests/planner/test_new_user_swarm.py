"""Issue 20's bug reports, on the swarm they came from: 16 A100-80GB in us-east, 4 RTX 4090 (24 GB) in
Germany, one H100 in Singapore, a 1.3B model (``geotrain.planner.generate.new_user_swarm``)."""

from __future__ import annotations

import json

import pytest

from geotrain.cli import main
from geotrain.errors import ScenarioError
from geotrain.planner import CostModel, Scenario, StageAssignment, evaluate, plan
from geotrain.planner.generate import DATASHEET_FP32_TFLOPS, new_user_swarm
from tests.planner.helpers import layer, link, peer, scenario


def _one_stage(ids: list[str]) -> list[list[StageAssignment]]:
    return [[StageAssignment(q, (0, 26))] for q in ids]


A100S = [f"a100-{i:02d}" for i in range(16)]


def test_memory_infeasible_peers_never_block_a_feasible_shape():
    # spec-sheet fp32 figures make a 4090 look 4x an A100, so it sorts first in every speed order; it
    # cannot hold the whole 1.3B model, and "stages": 1 used to fail with "the layers do not fit"
    d = new_user_swarm(tflops=DATASHEET_FP32_TFLOPS)
    d["job"]["stages"] = 1
    sc = Scenario.from_dict(d)
    r = plan(sc)
    used = {st.peer for pipe in r.pipelines for st in pipe}
    assert used >= set(A100S) and all(len(pipe) == 1 for pipe in r.pipelines)
    assert r.predicted.tokens_per_s >= evaluate(sc, _one_stage(A100S)).tokens_per_s * (1 - 1e-9)
    for q in (f"4090-{i}" for i in range(4)):
        assert q in r.spares and "cannot hold a stage" in r.spare_reasons[q] and "24 GB" in r.spare_reasons[q]


def test_large_swarm_is_not_worse_than_the_a100s_alone():
    sc = Scenario.from_dict(new_user_swarm(tflops=DATASHEET_FP32_TFLOPS))
    r = plan(sc, baselines=False, time_budget_s=10)
    assert r.predicted.tokens_per_s >= evaluate(sc, _one_stage(A100S)).tokens_per_s * (1 - 1e-9)


@pytest.mark.parametrize("bound", [100_000, 150_000])
def test_min_tokens_per_s_is_the_cheapest_plan_that_meets_it(bound):
    sc = Scenario.from_dict(new_user_swarm())
    r = plan(sc, objective={"min_tokens_per_s": bound}, baselines=False, time_budget_s=10)
    assert r.predicted.tokens_per_s >= bound
    # A100s at one stage each: the fewest that meet the bound is the cheapest such plan of them
    k = next(k for k in range(1, 17) if evaluate(sc, _one_stage(A100S[:k])).tokens_per_s >= bound)
    assert r.predicted.usd_per_hour <= evaluate(sc, _one_stage(A100S[:k])).usd_per_hour * (1 + 1e-9)
    fastest = plan(sc, baselines=False, time_budget_s=10).predicted
    assert r.predicted.usd_per_hour < fastest.usd_per_hour


def test_cost_objective_explains_a_free_answer():
    sc = Scenario.from_dict(new_user_swarm())
    r = plan(sc, objective="cost=1", baselines=False)
    assert r.predicted.usd_per_hour == 0
    # of the free plans the fastest: all four free 4090s work
    assert {st.peer for pipe in r.pipelines for st in pipe} == {f"4090-{i}" for i in range(4)}
    assert any("max_usd_per_hour" in n and "degenerate" in n and "within 10%" in n for n in r.notes)
    # "cost" alone keeps within 10% of the fastest plan: the free peers alone are far slower
    fastest = plan(sc, baselines=False).predicted
    plain = plan(sc, objective="cost", baselines=False)
    assert plain.predicted.tokens_per_s >= 0.9 * fastest.tokens_per_s * (1 - 1e-9) and not plain.notes


def test_infeasible_baselines_say_why(capsys, tmp_path, monkeypatch):
    d = new_user_swarm()
    d["job"]["stages"] = 1
    path = tmp_path / "swarm.json"
    path.write_text(json.dumps(d))
    assert main(["plan", "--scenario", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for name, v in out["baselines"].items():
        if v is None:
            assert "do not fit" in out["baseline_reasons"][name]
    assert "bottleneck" in out["predicted"] and out["stage_memory_gb"][0][0]["have"] == 80.0
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["plan", "--scenario", str(path)]) == 0
    text = capsys.readouterr().out
    assert "[0, 26)" in text and "0..25" not in text  # half-open layers, as in JSON and the docs
    assert "cannot hold a stage" in text and "/ 80" in text


# -- directional links ----------------------------------------------------------------------------
def _home(links):
    return Scenario.from_dict(scenario([peer("h", "home"), peer("c", "cloud")],
                                       [link("home", "home", 10, 1), link("cloud", "cloud", 10, 1), *links],
                                       stages=2, pipelines=1))


def test_a_link_and_its_reverse_are_two_directions():
    sc = _home([link("home", "cloud", 0.2, 30), link("cloud", "home", 1.0, 30)])
    assert sc.link("h", "c").bandwidth_gbps == 0.2 and sc.link("c", "h").bandwidth_gbps == 1.0
    # one entry holds both ways
    one = _home([link("home", "cloud", 0.2, 30)])
    assert one.link("c", "h").bandwidth_gbps == 0.2
    with pytest.raises(ScenarioError, match="repeats"):
        _home([link("home", "cloud", 0.2, 30), link("home", "cloud", 1.0, 30)])


def test_a_hop_pays_each_direction_at_its_own_bandwidth():
    # activations go h -> c at 0.2 Gbit/s, their gradients come back c -> h at 1 Gbit/s
    pipes = [[StageAssignment("h", (0, 2)), StageAssignment("c", (2, 4))]]

    def step(links):
        p = CostModel(_home(links)).predict(pipes)
        assert not isinstance(p, str)
        return p.pipeline_step_s

    slow = step([link("home", "cloud", 0.2, 30)])
    home = step([link("home", "cloud", 0.2, 30), link("cloud", "home", 1.0, 30)])
    fast = step([link("home", "cloud", 1.0, 30)])
    assert slow > home > fast
    # the fill crosses the hop once each way: A / 0.2 Gbit/s + A / 1 Gbit/s instead of 2 A / 0.2 Gbit/s
    cm = CostModel(_home([link("home", "cloud", 0.2, 30)]))
    a = cm.hop_bytes(2)
    saved_per_crossing = 2 * a / (0.2e9 / 8) - (a / (0.2e9 / 8) + a / (1e9 / 8))
    assert slow - home >= saved_per_crossing * (1 - 1e-9)


# -- memory ---------------------------------------------------------------------------------------
def test_activation_checkpointing_trades_memory_for_flops():
    prof = [layer(flops=1e9, params=100_000_000, act=2_000_000) for _ in range(4)]
    base = scenario([peer("p", "r")], [link("r", "r", 10, 1)], profile=prof, seq_len=1000, micro_batches=8)
    ck = json.loads(json.dumps(base))
    ck["model"]["activation_checkpointing"] = True
    plain, check = CostModel(Scenario.from_dict(base)), CostModel(Scenario.from_dict(ck))
    params = 4 * 100_000_000 / 2
    # stage 0 of 2 holds min(M, 2 - 0) = 2 microbatches in flight
    assert plain.stage_memory(0, 4, 0, 2) == pytest.approx(params * 20 + 2 * 1000 * 17 * 3 * 2_000_000)
    assert check.stage_memory(0, 4, 0, 2) == pytest.approx(params * 20 + 2 * 1000 * 3 * 2_000_000
                                                             + 1000 * 17 * 2_000_000)
    assert check.stage_compute_s(0, 4, 1e12) == pytest.approx(plain.stage_compute_s(0, 4, 1e12) * 4 / 3)
    with pytest.raises(ScenarioError, match="activation_checkpointing"):
        ck["model"]["activation_checkpointing"] = "yes"
        Scenario.from_dict(ck)


def test_a_plan_never_puts_more_on_a_peer_than_fits():
    d = new_user_swarm()
    d["model"]["activation_checkpointing"] = False
    sc = Scenario.from_dict(d)
    r = plan(sc, baselines=False)
    cm = CostModel(sc)
    for pipe in r.pipelines:
        for si, st in enumerate(pipe):
            assert cm.stage_memory(*st.layers, si, len(pipe)) <= sc.peer(st.peer).memory_bytes


def test_cost_with_a_slowdown_bound_keeps_the_speed():
    sc = Scenario.from_dict(new_user_swarm())
    fastest = plan(sc, baselines=False).predicted
    r = plan(sc, objective="cost=0.1", baselines=False)
    assert r.predicted.tokens_per_s >= 0.9 * fastest.tokens_per_s * (1 - 1e-9)
    assert r.predicted.usd_per_mtok <= fastest.usd_per_mtok
    assert r.objective.kind == "cost" and r.objective.value == 0.1
    assert not r.notes  # not the degenerate free plan
