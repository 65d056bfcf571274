"""An inner step has one commit point (geotrain.peers.worker.StageWorker.step).

A real one-peer plan (one pipeline of one stage, its own stage group) on a loopback transport: a
failure after the optimizer step never applies that step twice, and a checkpoint the disk refuses is
a typed CheckpointError, logged and counted, while training goes on and the next boundary writes again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from geotrain.config import JobSpec, job_from_dict
from geotrain.errors import CheckpointError, CheckpointWriteError, SwarmError
from geotrain.peers import checkpoint
from geotrain.peers.worker import StageWorker
from geotrain.plan import JobPlan, StageSlot
from geotrain.sync import Member, Membership, RoundId
from geotrain.sync.state import StageState
from geotrain.transport import Transport, TransportConfig


@pytest.fixture(scope="module")
def job() -> JobSpec:
    return job_from_dict({
        "job": {"name": "commit", "seed": 0},
        "model": {"preset": "tiny"},
        "data": {"max_bytes": 1 << 18},
        "pipeline": {"micro_batch_size": 2, "microbatches": 1},
        "sync": {"every": 2, "codec": "none"},
        "swarm": {"round_timeout_s": 5},
    })


@pytest.fixture
def transport() -> Iterator[Transport]:
    t = Transport(TransportConfig(), peer_id="p0", region="eu").start()
    try:
        yield t
    finally:
        t.close()


def _worker(job: JobSpec, t: Transport, *, ckpt: Path | None = None) -> StageWorker:
    blocks = job.model.block_model(job.job.seed).num_blocks
    plan = JobPlan(job_id="commit", version=1, num_blocks=blocks, sync_codec="none",
                   pipelines=((StageSlot(peer="p0", start=0, end=blocks, endpoint=t.address, region="eu"),),),
                   checkpoint_dir=None if ckpt is None else str(ckpt), checkpoint_every=0 if ckpt is None else 1)
    return StageWorker(job, plan, peer_id="p0", transport=t)


def _optimizer_steps(w: StageWorker) -> int:
    """How many optimizer steps AdamW applied (its per-parameter step count)."""
    counts = {int(s["step"]) for s in w.runtime.optimizer.state.values()}
    assert len(counts) <= 1, counts
    return counts.pop() if counts else 0


class FailingOnce:
    """A membership whose read fails once (as a DHT-backed one does when the DHT times out)."""

    def __init__(self, inner: Membership) -> None:
        self.inner = inner
        self.failed = 0

    def members(self, round_id: RoundId) -> Sequence[Member]:
        if not self.failed:
            self.failed += 1
            raise SwarmError("DHT read of the round's members timed out")
        return self.inner.members(round_id)


def test_a_sync_failure_after_the_optimizer_step_never_applies_it_twice(job: JobSpec, transport: Transport) -> None:
    w = _worker(job, transport)
    try:
        w.step(0)
        assert _optimizer_steps(w) == 1 and w.steps == 1
        runner = w.syncs[0].runner
        runner.membership = FailingOnce(runner.membership)
        with pytest.raises(SwarmError):
            w.step(1)  # the round due after step 1 cannot read its members: the step is applied, not committed
        assert _optimizer_steps(w) == 2 and w.steps == 1 and w.state().step == 1
        w.step(1)  # the agent retries the same step: only the sync runs now
        assert _optimizer_steps(w) == 2, "the optimizer step of step 1 was applied twice"
        assert w.steps == 2 and w.state().step == 2
        assert [o.committed for o in w.syncs[0].history] == [True]  # the round after step 1 ran once
        w.step(2)
        assert _optimizer_steps(w) == 3 and w.steps == 3
    finally:
        w.close()


def test_a_refused_checkpoint_is_typed_counted_and_retried_at_the_next_boundary(
    job: JobSpec, transport: Transport, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.write_text("a file where the checkpoint directory goes")
    state = StageState("commit", 0, 1, {"blocks.0.w": torch.zeros(2)}, {})
    with pytest.raises(CheckpointWriteError, match="cannot write checkpoint") as info:
        checkpoint.save_group(ckpt, state, start=0, end=1)
    assert isinstance(info.value, CheckpointError) and isinstance(info.value, OSError)  # typed, and still an OSError

    w = _worker(job, transport, ckpt=ckpt)
    try:
        with caplog.at_level(logging.ERROR, logger="geotrain.peers.worker"):
            w.step(0)  # checkpoint due after step 1: refused, logged, counted; the step commits
        assert w.checkpoint_failures == 1 and w.steps == 1 and w.state().step == 1
        assert w.stats()["checkpoint_failures"] == 1.0
        assert any("not written" in r.getMessage() for r in caplog.records)
        ckpt.unlink()  # the disk is fixed
        w.step(1)
        assert w.checkpoint_failures == 1 and w.steps == 2
        assert sorted(p.name for p in ckpt.iterdir()) == ["step-000002"]  # the next boundary wrote
        assert checkpoint.latest_complete(ckpt, w.plan.num_blocks) == 2
    finally:
        w.close()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_checkpoint_directory_does_not_stop_training(
    job: JobSpec, transport: Transport, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ro"
    ckpt.mkdir()
    ckpt.chmod(0o500)
    w = _worker(job, transport, ckpt=ckpt)
    try:
        w.step(0)
        w.step(1)
        assert w.checkpoint_failures == 2 and w.steps == 2
    finally:
        ckpt.chmod(0o700)
        w.close()
