"""Three stages in three processes on loopback (geotrain.pipeline.worker)."""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from geotrain.data import DataConfig, build_dataset
from geotrain.local.procs import ChildGroup
from geotrain.models import GPTConfig, HFModel, build_stage
from geotrain.transport import Message, Transport, TransportConfig
from tests.models.hf_util import write_config

pytestmark = pytest.mark.multiprocess

WORKER = "geotrain.pipeline.worker"
SEED, BATCH, MBS, LR = 5, 8, 4, 1e-3


def _launch(children: ChildGroup, *, steps: int, schedule: str, hop_timeout: float, extra: Sequence[str] = ()) -> list:
    procs = []
    for s in range(3):
        args = [
            "--peer-id", f"w{s}", "--stage", str(s), "--num-stages", "3", "--seed", str(SEED),
            "--steps", str(steps), "--batch-size", str(BATCH), "--microbatches", str(MBS),
            "--schedule", schedule, "--lr", str(LR), "--hop-timeout", str(hop_timeout), "--threads", "1", *extra,
        ]
        procs.append(children.start(f"w{s}", args, module=WORKER))
    ready = [p.wait_event("ready", timeout=60) for p in procs]
    table = {r["peer"]: r["address"] for r in ready}
    with Transport(TransportConfig(), peer_id="launcher").start() as t:
        for pid, addr in table.items():
            t.connect(pid, addr)
            t.request(pid, Message(kind="pp.wire", meta={"peers": table}), timeout=30)
    return procs


def _reference_losses(steps: int, model: HFModel | None = None) -> list[float]:
    cfg = GPTConfig.preset("tiny")
    ds = build_dataset(DataConfig(max_bytes=512 << 10))
    full = build_stage(model or cfg, (0, (model or cfg).num_blocks), SEED)
    seq_len = model.seq_len if model is not None else cfg.seq_len
    opt = torch.optim.AdamW(full.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    out = []
    for step in range(steps):
        batch = ds.get_batch(step, batch_size=BATCH, seq_len=seq_len, seed=SEED)
        total = 0.0
        for mb in batch.chunk(MBS):
            loss = full.loss(full(mb[:, :-1]), mb[:, 1:])
            total += float(loss.detach()) / MBS
            (loss / MBS).backward()
        out.append(total)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_three_processes_match_single_process_losses(children: ChildGroup, schedule: str) -> None:
    steps = 4
    procs = _launch(children, steps=steps, schedule=schedule, hop_timeout=60)
    losses = [procs[2].wait_event("step", timeout=60)["loss"] for _ in range(steps)]
    for p in procs:
        p.wait_event("done", timeout=60)
    assert losses == pytest.approx(_reference_losses(steps), abs=1e-5)


def test_three_processes_train_a_hugging_face_llama_like_one_process(children: ChildGroup, tmp_path: Path) -> None:
    path = write_config(tmp_path / "llama", "llama", vocab_size=256, max_position_embeddings=32)
    steps = 2
    procs = _launch(children, steps=steps, schedule="1f1b", hop_timeout=60, extra=["--hf-config", str(path)])
    losses = [procs[2].wait_event("step", timeout=60)["loss"] for _ in range(steps)]
    for p in procs:
        p.wait_event("done", timeout=60)
    assert losses == pytest.approx(_reference_losses(steps, HFModel.from_config(path, seed=SEED)), abs=1e-5)


def test_killed_middle_stage_makes_neighbours_raise_in_time(children: ChildGroup) -> None:
    timeout = 3.0
    procs = _launch(children, steps=10_000, schedule="1f1b", hop_timeout=timeout)
    procs[2].wait_event("step", timeout=60)  # the pipeline is running
    children.kill(procs[1], signal.SIGKILL)
    killed_at = time.monotonic()
    for p in (procs[0], procs[2]):
        failed = p.wait_event("failed", timeout=timeout + 20)
        assert isinstance(failed["step"], int)
        if p is procs[2] and failed["peer"] == "w0":
            # the last stage names the peer it waited on: if w1 died between steps, that is the first stage's
            # targets or tied gradient, which w0 (itself stuck on w1) never sends
            assert "no targets from peer w0" in failed["error"] or "no tied gradient" in failed["error"], failed
        else:
            assert failed["peer"] == "w1" and "w1" in failed["error"], failed
        assert p.proc.wait(timeout=10) == 3
    # both noticed within the hop deadline (plus process/scheduling slack on a loaded box)
    assert time.monotonic() - killed_at < timeout + 15
