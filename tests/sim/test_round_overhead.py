"""``SimConfig.round_overhead_s``: a fixed cost per round, part of the round's time like its all-reduce.

Without overlap it adds to every round; with overlap the round (all-reduce plus overhead) hides
behind the round's compute and only what is longer shows.
"""

from __future__ import annotations

from typing import Any

import pytest

from geotrain.errors import ConfigError
from geotrain.planner import CostModel, Prediction, Scenario, plan
from geotrain.sim import SimConfig, simulate
from tests.planner.helpers import link, peer, scenario

H = 20


def _swarm(*, overlap: bool, tau: int | None = None) -> Scenario:
    peers = [peer(f"p{i}", f"r{i % 2}", tflops=1.0, memory_gb=100, usd=1.0) for i in range(8)]
    links = [link("r0", "r0", 10.0, 1.0), link("r1", "r1", 10.0, 1.0), link("r0", "r1", 1.0, 50.0)]
    return Scenario.from_dict(scenario(peers, links, micro_batches=16, sync_every=H, sync_codec="int8",
                                       overlap_sync=overlap, overlap_steps=tau))


def _round_s(sc: Scenario, pipes: Any, overhead: float) -> float:
    """Simulated seconds per round: no churn, no stragglers, so every round lasts the same."""
    res = simulate(sc, SimConfig(hours=0.5, straggler_sigma=0.0, exact_pipelines=False, round_overhead_s=overhead),
                   initial_plan=pipes)
    assert res.rounds > 1 and res.wasted_tokens == 0
    return res.full_round_s / res.rounds


def _setup(overlap: bool, tau: int | None = None) -> tuple[Scenario, Any, float, float]:
    sc = _swarm(overlap=overlap, tau=tau)
    pipes = plan(sc, baselines=False).pipelines
    pred = CostModel(sc).predict(pipes)
    assert isinstance(pred, Prediction) and pred.round_sync_s > 0
    return sc, pipes, H * pred.pipeline_step_s, pred.round_sync_s


def test_without_overlap_every_round_pays_the_overhead() -> None:
    sc, pipes, compute, sync = _setup(overlap=False)
    assert _round_s(sc, pipes, 0.0) == pytest.approx(compute + sync, rel=1e-9)
    assert _round_s(sc, pipes, 2.5) == pytest.approx(compute + sync + 2.5, rel=1e-9)


def test_with_overlap_the_overhead_hides_behind_compute_until_it_does_not() -> None:
    sc, pipes, compute, sync = _setup(overlap=True)
    assert sync < compute
    hidden = 0.5 * (compute - sync)  # all-reduce plus overhead still shorter than the round's compute
    assert _round_s(sc, pipes, hidden) == pytest.approx(_round_s(sc, pipes, 0.0), rel=1e-9)
    assert _round_s(sc, pipes, hidden) == pytest.approx(compute, rel=1e-9)
    longer = compute  # now the round is all-reduce plus overhead, longer than compute
    assert _round_s(sc, pipes, longer) == pytest.approx(sync + longer, rel=1e-9)


@pytest.mark.parametrize("tau", [0, 1, H // 4, H // 2, H])
def test_with_overlap_tau_the_round_hides_behind_tau_steps_only(tau: int) -> None:
    # the runtime applies a round's result tau inner steps after it starts and blocks there if it is late
    sc, pipes, compute, sync = _setup(overlap=True, tau=tau)
    for overhead in (0.0, 0.5 * compute, compute):
        exposed = max(0.0, sync + overhead - compute * tau / H)
        assert _round_s(sc, pipes, overhead) == pytest.approx(compute + exposed, rel=1e-9)


def test_negative_round_overhead_is_refused() -> None:
    with pytest.raises(ConfigError, match="round_overhead_s"):
        SimConfig(round_overhead_s=-0.1)
