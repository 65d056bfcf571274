"""Exact plans on topologies small enough to check by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from geotrain.errors import InfeasiblePlanError
from geotrain.planner import Scenario, plan
from tests.planner.helpers import layer, link, peer, scenario

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"

# 4 layers of 1e9 parameter bytes: 0.5e9 bf16 params x 20 B of training state = 10 GB per layer
HEAVY = [layer(flops=1e9, params=1_000_000_000, act=100_000) for _ in range(4)]


def _layers(result):
    return [[(st.peer, list(st.layers)) for st in pipe] for pipe in result.pipelines]


def test_two_regions_four_peers_keep_pipelines_inside_regions():
    # 25 GB peers hold at most 2 layers, so 2 stages. A hop over the 0.1 Gbit/s cross link would take
    # 2 x 1e7 B / 1.25e7 B/s = 1.6 s per microbatch against 0.2 s of compute; the int4 round (5.2e8 B,
    # 41 s) hides behind 1000 inner steps
    sc = Scenario.from_dict(scenario(
        [peer(p, r, memory_gb=25) for p, r in (("a0", "eu"), ("a1", "eu"), ("b0", "us"), ("b1", "us"))],
        [link("eu", "eu", 10, 1), link("us", "us", 10, 1), link("eu", "us", 0.1, 80)],
        profile=HEAVY, sync_every=1000, sync_codec="int4",
    ))
    r = plan(sc)
    assert r.method == "exact"
    assert r.to_json()["plan"] == {
        "pipelines": [[{"peer": "a0", "layers": [0, 2]}, {"peer": "a1", "layers": [2, 4]}],
                      [{"peer": "b0", "layers": [0, 2]}, {"peer": "b1", "layers": [2, 4]}]],
        "spares": [],
    }
    # only the stage groups' pseudo-gradients cross, once per 1000 steps
    assert set(r.predicted.bytes_per_region_pair) >= {("eu", "us"), ("us", "eu")}
    # 2 stages of 0.2 s and a 1 ms + 1 ms RTT hop: the 2-microbatch loop (0.2 + 0.2 + 0.0025) / 2 sets the pace
    assert r.predicted.bottleneck == "round trip a0..a1"


def test_slow_peer_pair_override_is_never_a_hop():
    sc = Scenario.from_dict(scenario(
        [peer("p0", "r", memory_gb=25), peer("p1", "r", memory_gb=25), peer("p2", "r", memory_gb=25)],
        [link("r", "r", 10, 1), link("p0", "p1", 0.001, 1)],
        profile=HEAVY, stages=2, pipelines=1,
    ))
    r = plan(sc)
    assert _layers(r) == [[("p0", [0, 2]), ("p2", [2, 4])]]
    assert r.spares == ["p1"]


def _cheap_and_fast():
    return Scenario.from_dict(scenario(
        [peer("f0", "fast", tflops=100, usd=4.0), peer("f1", "fast", tflops=100, usd=4.0),
         peer("c0", "cheap", tflops=25, usd=0.5), peer("c1", "cheap", tflops=25, usd=0.5)],
        [link("fast", "fast", 10, 1), link("cheap", "cheap", 10, 1), link("fast", "cheap", 1, 50)],
        regions={"fast": 0.02, "cheap": 0.02}, sync_every=100,
    ))


def test_throughput_avoids_the_cheap_slow_region():
    r = plan(_cheap_and_fast(), objective="throughput")
    assert _layers(r) == [[("f0", [0, 4])], [("f1", [0, 4])]]
    assert r.spares == ["c0", "c1"]


def test_cost_at_any_speed_prefers_the_cheap_slow_region():
    fast = plan(_cheap_and_fast(), objective="throughput")
    r = plan(_cheap_and_fast(), objective="cost=1")
    assert _layers(r) == [[("c0", [0, 4])], [("c1", [0, 4])]]
    assert r.spares == ["f0", "f1"]
    assert r.predicted.usd_per_mtok < fast.predicted.usd_per_mtok / 1.9  # 50 vs 25 TFLOP/s per USD/hour


def test_cost_alone_keeps_within_ten_percent_of_the_fastest():
    """The cheap region makes half the fast one's tokens/s, so plain ``cost`` (= cost=0.1) may not take it
    alone; the cheapest plan within 10% of the fastest is the fastest plan, or it plus cheap peers."""
    fast = plan(_cheap_and_fast(), objective="throughput").predicted
    r = plan(_cheap_and_fast(), objective="cost")
    bounded = plan(_cheap_and_fast(), objective="cost=0.1")
    assert r.predicted.tokens_per_s >= 0.9 * fast.tokens_per_s * (1 - 1e-9)
    assert r.predicted.usd_per_mtok <= fast.usd_per_mtok * (1 + 1e-9)
    assert _layers(r) == _layers(bounded) and r.predicted == bounded.predicted


def test_budget_cap_and_throughput_floor():
    r = plan(_cheap_and_fast(), objective={"max_usd_per_hour": 4.5})
    assert r.predicted.usd_per_hour <= 4.5
    assert _layers(r) == [[("f0", [0, 4])]]
    best = plan(_cheap_and_fast(), objective="throughput").predicted.tokens_per_s
    r2 = plan(_cheap_and_fast(), objective={"min_tokens_per_s": best * 0.2})
    assert r2.predicted.tokens_per_s >= best * 0.2
    assert r2.predicted.usd_per_hour == pytest.approx(1.0, rel=1e-3)  # the two cheap peers make ~25%
    with pytest.raises(InfeasiblePlanError, match="min_tokens_per_s"):
        plan(_cheap_and_fast(), objective={"min_tokens_per_s": best * 1.5})


def test_too_little_memory_names_it():
    sc = Scenario.from_dict(scenario([peer("a", "r", memory_gb=5), peer("b", "r", memory_gb=5)],
                                     [link("r", "r", 10, 1)], profile=HEAVY))
    with pytest.raises(InfeasiblePlanError, match=r"layer 0 alone needs 10\.\d GB .* largest peer \(a\) has 5 GB"):
        plan(sc)


def test_not_enough_memory_in_all():
    sc = Scenario.from_dict(scenario([peer("a", "r", memory_gb=15), peer("b", "r", memory_gb=15)],
                                     [link("r", "r", 10, 1)], profile=HEAVY))
    with pytest.raises(InfeasiblePlanError, match="swarm has 30.0 GB"):
        plan(sc)


def test_disconnected_regions_name_the_missing_link():
    sc = Scenario.from_dict(scenario([peer("a", "eu"), peer("b", "us")], []))
    with pytest.raises(InfeasiblePlanError, match=r'disconnected: eu \| us.*"a": "eu", "b": "us"'):
        plan(sc)


def test_region_without_inner_link_is_named():
    sc = Scenario.from_dict(scenario([peer("a", "eu"), peer("b", "eu")], []))
    with pytest.raises(InfeasiblePlanError, match="region 'eu' has 2 peers but no link inside it"):
        plan(sc)


def test_fixed_shape_is_respected():
    sc = Scenario.from_dict(scenario([peer(f"p{i}", "r") for i in range(6)], [link("r", "r", 10, 1)],
                                     stages=2, pipelines=2))
    r = plan(sc)
    assert len(r.pipelines) == 2 and all(len(p) == 2 for p in r.pipelines)
    assert len(r.spares) == 2


def test_cost_on_heterogeneous_price_meets_issue_targets():
    """Spot V100s and 8x dearer A100s: ``cost`` cuts USD per 1M tokens >= 30% at <= 10% fewer tokens/s.

    The cheapest tokens at any speed (``cost=1``) are the spot V100s alone, 20% slower than the
    fastest plan; every plan within 10% of it needs A100s, which cost more per token than the V100s.
    """
    sc = Scenario.from_dict(json.loads((EXAMPLES / "heterogeneous_price.json").read_text()))
    fast = plan(sc, objective="throughput", baselines=False).predicted
    cheap = plan(sc, objective="cost", baselines=False).predicted
    assert cheap.usd_per_mtok <= 0.7 * fast.usd_per_mtok
    assert cheap.tokens_per_s >= 0.9 * fast.tokens_per_s * (1 - 1e-9)
    anyspeed = plan(sc, objective="cost=1", baselines=False).predicted
    assert anyspeed.usd_per_mtok <= cheap.usd_per_mtok and anyspeed.tokens_per_s < cheap.tokens_per_s
