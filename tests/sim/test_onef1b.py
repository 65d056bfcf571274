"""The event-level 1F1B schedule: exact small cases, and the planner's closed form against it."""

from __future__ import annotations

import random

import pytest

from geotrain.errors import ConfigError
from geotrain.planner import CostModel, Scenario, StageAssignment
from geotrain.sim.onef1b import PipelineTiming, one_f_one_b_order, simulate_step, timing_from_plan
from tests.planner.helpers import layer, link, peer, scenario


def _timing(C, hop_s=(), rtt=(), M=8, duplex=False):
    return PipelineTiming(fwd_s=tuple(c / 3 for c in C), bwd_s=tuple(2 * c / 3 for c in C),
                          hop_bytes=tuple(hop_s), hop_bytes_per_s=(1.0,) * len(hop_s), hop_rtt_s=tuple(rtt),
                          microbatches=M, duplex=duplex)


def test_order_is_1f1b():
    assert one_f_one_b_order(0, 3, 4) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]
    assert one_f_one_b_order(2, 3, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]


@pytest.mark.parametrize("M", [1, 4, 32])
def test_balanced_stages_without_links(M):
    # S equal stages of C, free links: fill S x C, then one C per further microbatch
    assert simulate_step(_timing([1.0, 1.0, 1.0], (0.0, 0.0), (0.0, 0.0), M=M)) == pytest.approx(3.0 + (M - 1) * 1.0)


def test_single_stage_is_m_times_c():
    assert simulate_step(_timing([0.3], M=10)) == pytest.approx(3.0)


def test_slow_link_sets_the_pace():
    # a hop busy 0.5 s each way per microbatch on a shared link: 1.0 s per microbatch in steady state
    t = simulate_step(_timing([0.1, 0.1], (0.5,), (0.0,), M=20))
    assert t == pytest.approx(0.1 + 0.1 + 2 * 0.5 + 19 * 1.0, rel=0.02)
    # full duplex: the two-microbatch loop (0.1 + 0.5 + 0.1 + 0.5) / 2 = 0.6 s sets the pace instead
    assert simulate_step(_timing([0.1, 0.1], (0.5,), (0.0,), M=20, duplex=True)) == pytest.approx(
        0.2 + 1.0 + 19 * 0.6, rel=0.02)


def test_bad_timing_is_refused():
    with pytest.raises(ConfigError, match="hops"):
        _timing([1.0, 1.0], (), ())


def test_closed_form_tracks_the_schedule():
    rng = random.Random(7)
    ratios = []
    for _ in range(60):
        S, M = rng.randint(1, 5), rng.choice([16, 32])
        L = S + rng.randint(0, 3)
        prof = [layer(flops=rng.uniform(0.5e9, 2e9), act=rng.randint(1, 40) * 10_000) for _ in range(L)]
        peers = [peer(f"p{i}", f"r{i}", tflops=rng.choice([0.5, 1, 2])) for i in range(S)]
        links = [link(f"r{i}", f"r{j}", rng.choice([0.05, 0.2, 1.0]), rng.uniform(0, 300))
                 for i in range(S) for j in range(i + 1, S)]
        cm = CostModel(Scenario.from_dict(scenario(peers, links, profile=prof, micro_batches=M)))
        cuts = [*sorted(rng.sample(range(1, L), S - 1)), L]
        pipe = [StageAssignment(f"p{i}", (a, b)) for i, (a, b) in enumerate(zip([0, *cuts[:-1]], cuts, strict=True))]
        pred = cm.predict([pipe])
        assert not isinstance(pred, str)
        ratios.append(pred.pipeline_step_s / simulate_step(timing_from_plan(cm, pipe)))
    # the closed form stays within ~12% of the event-level schedule for M >= 16
    assert min(ratios) >= 0.88 and max(ratios) <= 1.12
