"""The coordinator's fetch of the final global model asks a silent stage group again."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from geotrain.config import job_from_dict
from geotrain.coordinator.evaluate import fetch_global
from geotrain.errors import StateTransferError
from geotrain.plan import JobPlan, StageSlot
from geotrain.sync.state import KIND, StageState, serve_state
from geotrain.transport import Message, Transport, TransportConfig
from tests.coordinator.test_job_e2e import tiny_job


class _Silent:
    """A transport seen through serve_state's eyes: the first ``silent`` state requests get no reply."""

    def __init__(self, transport: Transport, silent: int) -> None:
        self.transport, self.silent, self.asked = transport, silent, 0

    def serve(self, kind: str, handler: Any) -> None:
        def maybe(req: Message) -> Message | None:
            self.asked += 1
            if kind == KIND and self.asked <= self.silent:
                return None
            return handler(req)

        self.transport.serve(kind, maybe if kind == KIND else handler)


def _holder(peer: str, block: int, silent: int) -> tuple[Transport, _Silent]:
    t = Transport(TransportConfig(), peer_id=peer).start()
    state = StageState("j", 3, 30, {f"blocks.{block}.w": torch.full((4,), float(block + 1))}, {})
    view = _Silent(t, silent)
    serve_state(view, lambda: None, lambda: state)  # type: ignore[arg-type]
    return t, view


@pytest.mark.timeout(60)
@pytest.mark.parametrize("silent, attempts, ok", [(1, 2, True), (2, 2, False)])
def test_a_group_silent_once_is_asked_again_and_one_silent_throughout_fails_typed(
    silent: int, attempts: int, ok: bool
) -> None:
    a, _ = _holder("A", 0, 0)
    b, b_view = _holder("B", 1, silent)
    me = Transport(TransportConfig(), peer_id="coord").start()
    try:
        plan = JobPlan(job_id="j", version=1, num_blocks=2, stop_step=30, pipelines=(
            (StageSlot(peer="A", start=0, end=1, endpoint=a.address), StageSlot(peer="B", start=1, end=2,
                                                                              endpoint=b.address)),
        ))
        job = job_from_dict(tiny_job(steps=30))
        if ok:
            state = fetch_global(job, plan, me, timeout=0.5, attempts=attempts)
            assert (state.round, state.step) == (3, 30)
            assert torch.equal(state.params["blocks.1.w"], torch.full((4,), 2.0))
            assert sorted(state.params) == ["blocks.0.w", "blocks.1.w"]
        else:
            with pytest.raises(StateTransferError, match="no reply to state.get from B"):
                fetch_global(job, plan, me, timeout=0.5, attempts=attempts)
        assert b_view.asked == min(silent + 1, attempts)
    finally:
        for t in (me, a, b):
            t.close()
