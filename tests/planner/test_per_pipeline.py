"""Per-pipeline layer splits: each pipeline cut for its own peers, pipelines of different stage counts."""

from __future__ import annotations

import pytest

from geotrain.planner import CostModel, Scenario, evaluate, plan
from geotrain.planner.baselines import GeneticConfig
from geotrain.planner.generate import heterogeneous_mix
from tests.planner.helpers import layer, link, peer, scenario

QUICK_GA = GeneticConfig(population=8, generations=4, stall=2, time_budget_s=1.0)
# 4 layers of 1e9 parameter bytes: 0.5e9 bf16 params x 20 B of training state = 10 GB per layer
HEAVY = [layer(flops=1e9, params=1_000_000_000, act=100_000) for _ in range(4)]


def _two_pipelines():
    # f0 fast and large, t0 fast but 12 GB (one layer), s0/s1 slow and large. One split for both
    # pipelines gives t0's column one layer and the other three, and that column holds a slow peer
    # (period 3 layers / 1). Cut apart: (f0 three layers, t0 one) and (s0 two, s1 two): period 2
    return Scenario.from_dict(scenario(
        [peer("f0", "r", tflops=4, memory_gb=100), peer("t0", "r", tflops=4, memory_gb=12),
         peer("s0", "r", tflops=1, memory_gb=100), peer("s1", "r", tflops=1, memory_gb=100)],
        [link("r", "r", 10, 1)], profile=HEAVY, stages=2, pipelines=2, sync_every=1000,
    ))


def test_each_pipeline_gets_its_own_boundaries():
    sc = _two_pipelines()
    r = plan(sc, genetic=QUICK_GA)
    bounds = {tuple(st.layers for st in pipe) for pipe in r.pipelines}
    assert len(bounds) == 2  # two different splits
    uni = r.baselines["uniform_split"]
    assert uni is not None and r.predicted.tokens_per_s > 1.15 * uni.tokens_per_s  # 767 vs 644 tokens/s
    assert sorted(tuple((st.peer, st.layers) for st in pipe) for pipe in r.pipelines) == [
        (("f0", (0, 3)), ("t0", (3, 4))), (("s0", (0, 2)), ("s1", (2, 4)))]
    # the cost model prices the mixed plan exactly as evaluate() does, and every stage fits
    assert evaluate(sc, r.pipelines).tokens_per_s == pytest.approx(r.predicted.tokens_per_s, rel=1e-12)
    cm = CostModel(sc)
    for pipe in r.pipelines:
        for si, st in enumerate(pipe):
            assert cm.stage_memory(*st.layers, si, len(pipe)) <= sc.peer(st.peer).memory_bytes


def test_heterogeneous_mix_runs_small_cards_in_longer_pipelines():
    sc = Scenario.from_dict(heterogeneous_mix())
    r = plan(sc, genetic=QUICK_GA, time_budget_s=5)
    uni = r.baselines["uniform_split"]
    assert uni is not None
    assert r.predicted.tokens_per_s >= 1.2 * uni.tokens_per_s
    assert len({len(pipe) for pipe in r.pipelines}) > 1  # pipelines differ in stage count
    cm = CostModel(sc)
    for pipe in r.pipelines:
        for si, st in enumerate(pipe):
            assert cm.stage_memory(*st.layers, si, len(pipe)) <= sc.peer(st.peer).memory_bytes
    assert evaluate(sc, r.pipelines).tokens_per_s == pytest.approx(r.predicted.tokens_per_s, rel=1e-12)
    js = r.to_json()
    assert set(js["baselines"]) >= {"uniform_split"} and len(js["stage_memory_gb"]) == len(r.pipelines)


def test_the_live_planner_publishes_pipelines_cut_at_different_boundaries():
    """The coordinator's own path (``geotrain.coordinator.planning.make_plan``: DHT records -> scenario ->
    planner -> ``JobPlan``) on records of unlike peers, as ``_two_pipelines``: f0 fast and large, t0 fast
    with room for a quarter of the model, s0 and s1 slow. The plan it would publish cuts its two pipelines
    apart, and its stage groups are the block segments the runtime syncs (``tests/peers/test_mixed_splits.py``
    runs such a plan)."""
    import time

    from geotrain.config import job_from_dict
    from geotrain.coordinator.planning import make_plan
    from geotrain.swarm.records import LinkMeasurement, LinkRow, PeerRecord

    now = time.time()
    kinds = {"QmF0": (4e12, 10**9), "QmT0": (4e12, 20 * 10**6), "QmS0": (1e12, 10**9), "QmS1": (1e12, 10**9)}
    peers = {p: PeerRecord(peer_id=p, region="us", device="cpu", flops=f, memory_bytes=m, usd_per_hour=1.0,
                           endpoint="tcp://127.0.0.1:5555", version="0.1", started_at=now, heartbeat_at=now)
             for p, (f, m) in kinds.items()}
    links = {p: LinkRow(src=p, links={q: LinkMeasurement(bandwidth_bps=1.25e9, rtt_s=0.001, measured_at=now)
                                      for q in kinds if q != p}) for p in kinds}
    job = job_from_dict({"job": {"name": "mixed"}, "model": {"preset": "small"},
                         "pipeline": {"stages": 2, "pipelines": 2, "micro_batch_size": 4, "microbatches": 16},
                         "sync": {"every": 100}})
    jp, out = make_plan(job, "mixed", version=1, peers=peers, links=links)
    cuts = sorted([(s.peer, s.start, s.end) for s in pipe] for pipe in jp.pipelines)
    assert cuts == [[("QmS0", 0, 4), ("QmS1", 4, 8)], [("QmT0", 0, 2), ("QmF0", 2, 8)]]
    assert [(g.start, g.end, set(g.members)) for g in jp.sync_groups()] == [
        (0, 2, {"QmS0", "QmT0"}), (2, 4, {"QmS0", "QmF0"}), (4, 8, {"QmS1", "QmF0"})]
    # one split for both pipelines would have to fit t0's quarter of the model in its column
    assert out["predicted"]["tokens_per_s"] >= 1.15 * out["baselines"]["uniform_split"]["tokens_per_s"]


def test_the_live_planner_refuses_an_empty_swarm_as_infeasible():
    """A replan whose read of the swarm found nobody (every planned peer missing past its grace) is an
    InfeasiblePlanError the coordinator reports and waits out, not a malformed scenario that ends the job."""
    import pytest

    from geotrain.config import job_from_dict
    from geotrain.coordinator.planning import make_plan
    from geotrain.errors import InfeasiblePlanError

    job = job_from_dict({"job": {"name": "empty"}, "model": {"preset": "tiny"}})
    with pytest.raises(InfeasiblePlanError, match="no live peer"):
        make_plan(job, "empty", version=2, peers={}, links={})
