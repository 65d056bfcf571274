"""Calibration run for ``--regime``: this machine's compute time per inner step of the benchmark's model under its load.

One worker per peer (as many as the contenders run, at the same time, one
thread each), each training the benchmark's own model on its own batch with
AdamW and no communication: ``warmup`` steps, then ``steps`` timed steps
(forward, backward, optimizer). The *measured step* is the median over the
workers of their mean timed step, so the figure includes the contention of
``peers`` processes sharing this machine's cores, as in the real runs::

    python -m benchmarks.contenders.calibrate --spec SPEC.json --rank R
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.contenders.common import Setup, WorkerSpec, emit, wait_go

WARMUP = 2


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """``step_s``: the measured step (median over workers); ``per_worker_s``: each worker's mean; ``params``: the model's."""

    step_s: float
    per_worker_s: tuple[float, ...]
    params: int
    steps: int


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.contenders.calibrate", description=__doc__)
    p.add_argument("--spec", required=True)
    p.add_argument("--rank", type=int, required=True)
    args = p.parse_args(argv)
    spec = WorkerSpec.load(args.spec)
    s = Setup(spec, args.rank)
    opt = s.optimizer()
    params = sum(q.numel() for q in s.model.parameters() if q.requires_grad)
    emit({"event": "ready", "rank": args.rank, "params": params})
    wait_go(spec.go_timeout_s)
    t0 = 0.0
    for step in range(WARMUP + spec.steps):
        if step == WARMUP:
            t0 = time.perf_counter()
        opt.zero_grad()
        s.forward_backward(step)
        opt.step()
    emit({"event": "done", "rank": args.rank, "step_s": (time.perf_counter() - t0) / spec.steps, "params": params})
    return 0


def run_calibration(spec: WorkerSpec, *, work_dir: Path, timeout_s: float) -> Calibration:
    """Run ``spec.world`` calibration workers at once (on loopback: they do not talk) and collect their steps."""
    from benchmarks.contenders.launch import LoopbackNetwork, Procs

    work_dir.mkdir(parents=True, exist_ok=True)
    spec = replace(spec, contender="calibrate", out_dir=str(work_dir / "unused"))
    path = spec.dump(work_dir / "calibrate-spec.json")
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    with Procs(LoopbackNetwork(), stderr_dir=str(work_dir)) as procs:
        workers = [procs.start_in(f"calibrate{r}", "benchmarks.contenders.calibrate",
                                  ["--spec", str(path), "--rank", str(r)], region="-") for r in range(spec.world)]
        for w in workers:
            w.wait_event("ready", left())
        for w in workers:
            w.send("go")
        dones = [w.wait_event("done", left()) for w in workers]
    steps = tuple(float(d["step_s"]) for d in dones)
    return Calibration(step_s=statistics.median(steps), per_worker_s=steps, params=int(dones[0]["params"]),
                       steps=spec.steps)


if __name__ == "__main__":
    raise SystemExit(main())
