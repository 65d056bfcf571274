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
