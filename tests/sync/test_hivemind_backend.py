"""Flat DiLoCo on hivemind's averager (the benchmark's OpenDiLoCo contender): a round is bounded as a whole."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import pytest
import torch

from geotrain.sync import DiLoCoConfig
from geotrain.sync.hivemind_backend import HivemindDiLoCoSync
from geotrain.sync.round import RoundStatus


class _Wedged:
    """An averager whose round never ends: a group was found and a member stopped answering mid all-reduce."""

    def __init__(self, real: Any) -> None:
        self.get_tensors = real.get_tensors  # the averaged tensors stay the real averager's
        self.cancelled = 0
        self.asked: list[dict[str, Any]] = []

    def step(self, **kwargs: Any) -> Any:
        self.asked.append(kwargs)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        outer = self

        class Control:
            def result(self, timeout: float | None = None) -> Any:
                return future.result(timeout=timeout)

            def cancel(self) -> bool:
                outer.cancelled += 1
                return future.cancel()

        return Control()

    def shutdown(self) -> None:
        pass


@pytest.mark.timeout(60)
def test_a_wedged_all_reduce_discards_the_round_instead_of_holding_the_peer() -> None:
    import hivemind

    dht = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], start=True)
    model = torch.nn.Linear(4, 4)
    sync = HivemindDiLoCoSync(DiLoCoConfig(every=2, fragments=1, overlap=0, deadline_floor_s=0.2),
                              params=list(model.named_parameters()), dht=dht, region="eu", group_size=2,
                              prefix="wedged")
    real = sync._averager
    sync._averager = _Wedged(real)
    try:
        before = [p.detach().clone() for p in model.parameters()]
        (outcome,) = sync.after_inner_step(2)
        assert outcome.status is RoundStatus.ABANDONED and sync.stats.rounds_discarded == 1
        assert sync._averager.cancelled == 1  # the step was called off, not left running
        assert sync._averager.asked == [{"timeout": 0.2, "allow_retries": True, "wait": False}]
        assert outcome.seconds >= 0.4  # twice the deadline was waited, no less
        for a, b in zip(before, model.parameters(), strict=True):  # a discarded round changes nothing
            assert torch.equal(a, b.detach())
    finally:
        real.shutdown()
        dht.shutdown()
