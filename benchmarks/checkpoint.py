"""Peer-held checkpoints: size, write time, training stall per checkpoint, resume fetch time, bitwise resume.

What it measures, for each preset: real StageWorkers (pipelines x stages, one thread and one loopback
transport each, as :mod:`benchmarks.workers`) train ``2 * every`` inner steps with a state store each
(:mod:`geotrain.peers.statestore`), checkpointing after every round. Per checkpoint and peer:

- ``size_bytes``: the shard files one peer writes (global params + outer momentum + its local state);
- ``write_s``: the store's writer thread serialising and writing them (off the training thread);
- ``stall_s``: what the step thread spends on a checkpoint (copying the state out, plus any wait in
  ``submit`` for the previous write); the ratio printed is ``stall_s`` over the mean inner step time of
  the same run (the baseline);
- ``resume_load_s``: a peer loading its blocks back from its own state directory (verified);
- ``resume_fetch_s``: a fresh peer fetching a stage's blocks of that step from a donor over the data
  plane (loopback ZMQ, verified by SHA-256);
- ``multi_donor``: the same fetch with each of the stage's two holders behind a TCP relay capping it at
  ``--link-mbit`` (a slow WAN link per donor), from one donor (``one_s``) and in chunks from both at once
  (``chunked_s``, verified whole); ``speedup`` is their ratio.

It then checks the point of the exercise: fresh workers resumed at step ``every`` from copies of the
state directories and run to ``2 * every`` end with global parameters bitwise equal to those of the
uninterrupted run (``bitwise_resume``), which needs the local state (error-feedback residuals, AdamW
moments) restored too.

    python -m benchmarks.checkpoint [--presets tiny,small] [--every 5] [--link-mbit 100] [--tiny]

Prints one JSON line per preset and a summary line; exit 1 if a resume was not bitwise.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.workers import _plan


def _job(preset: str, every: int, micro_batch: int, microbatches: int) -> Any:
    from geotrain.config import job_from_dict

    return job_from_dict({
        "job": {"name": "bench-ckpt", "seed": 0},
        "model": {"preset": preset},
        "data": {"max_bytes": 2 << 20},
        "pipeline": {"stages": 2, "pipelines": 2, "micro_batch_size": micro_batch, "microbatches": microbatches},
        "sync": {"every": every, "codec": "int8"},
        "stop": {"steps": 2 * every},
        "swarm": {"hop_timeout_s": 120, "round_timeout_s": 120},
    })


def _train(job: Any, plan: Any, transports: dict[str, Any], stores: dict[str, Any], first: int, last: int,
           ) -> dict[str, Any]:
    """Workers of ``plan`` on ``transports`` with ``stores``, inner steps ``[first, last)``; their figures."""
    from geotrain.peers.worker import StageWorker

    workers = {pid: StageWorker(job, plan, peer_id=pid, transport=t, store=stores[pid])
               for pid, t in transports.items()}
    errors: list[BaseException] = []

    def drive(pid: str) -> None:
        try:
            for step in range(first, last):
                workers[pid].step(step)
            workers[pid].finish()
        except BaseException as e:  # reported by the caller after join
            errors.append(e)

    threads = [threading.Thread(target=drive, args=(pid,)) for pid in workers]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    out = {
        "globals": {pid: w.state().params for pid, w in workers.items()},
        "sources": sorted({w.state_source for w in workers.values()}),
        "local_restored": all(w.local_restored for w in workers.values()),
        "step_s": statistics.mean(w.wall_s / max(1, w.steps) for w in workers.values()),
        "stall_s": statistics.mean(w.checkpoint_s / max(1, w.peer_checkpoints) for w in workers.values()),
        "checkpoints": min(w.peer_checkpoints for w in workers.values()),
    }
    for w in workers.values():
        w.close()
    return out


def _multi_donor_fetch(plan: Any, stores: dict[str, Any], step: int, blocks: tuple[int, int],
                       link_mbit: float) -> dict[str, Any]:
    """A fresh peer fetching stage 0's blocks of ``step`` from its two holders, each reached through a TCP relay
    that caps the replies at ``link_mbit`` (one slow WAN link per donor): from one donor, then in chunks from
    both at once."""
    import contextlib

    from geotrain.sync.state import digest, fetch_state, serve_state
    from geotrain.testing.faultproxy import Fault, FaultProxy, FaultProxyConfig
    from geotrain.transport import Transport, TransportConfig

    holders = [pipe[0].peer for pipe in plan.pipelines]
    cap = Fault(kind="rate", rate_bytes_per_s=link_mbit * 1e6 / 8, direction="down")
    with contextlib.ExitStack() as stack:
        donors = {pid: stack.enter_context(Transport(TransportConfig(), peer_id=pid).start()) for pid in holders}
        joiner = stack.enter_context(Transport(TransportConfig(), peer_id="joiner").start())
        for pid, t in donors.items():
            store = stores[pid]
            serve_state(t, lambda: None, lambda: None, lambda j, s0, e0, st, store=store: store.load(j, st, s0, e0))
            proxy = stack.enter_context(FaultProxy(FaultProxyConfig(target=t.address, fault=cap)))
            joiner.connect(pid, proxy.address)
        mine = stores[holders[0]].load(plan.job_id, step, *blocks)
        assert mine is not None
        sizes = {n: t.numel() for n, t in mine.params.items()}
        out: dict[str, Any] = {"link_mbit": link_mbit, "donors": len(holders)}
        for label, parallel in (("one", 1), ("chunked", len(holders))):
            t0 = time.perf_counter()
            got = fetch_state(joiner, holders, job_id=plan.job_id, start=blocks[0], end=blocks[1],
                              need=list(mine.params), timeout=300, step=step, sizes=sizes, parallel=parallel)
            out[f"{label}_s"] = time.perf_counter() - t0
            out[f"{label}_bitwise"] = digest(got.params) == digest(mine.params)
        out["speedup"] = out["one_s"] / out["chunked_s"]
        return out


def run_preset(preset: str, *, every: int, micro_batch: int, microbatches: int, root: Path,
               link_mbit: float = 100.0) -> dict[str, Any]:
    import dataclasses

    from geotrain.peers.statestore import StateStore
    from geotrain.sync.state import digest, fetch_state, serve_state
    from geotrain.transport import Transport, TransportConfig

    job = _job(preset, every, micro_batch, microbatches)
    ids = [[f"p{p}s{s}" for s in range(2)] for p in range(2)]
    flat = [pid for row in ids for pid in row]
    num_blocks = job.model.block_model(job.job.seed).num_blocks

    def transports() -> dict[str, Any]:
        return {pid: Transport(TransportConfig(), peer_id=pid, region=f"r{p}").start()
                for p, row in enumerate(ids) for pid in row}

    # the uninterrupted run: 2 rounds, a checkpoint after each
    tr = transports()
    try:
        plan = _plan(job, ids, {pid: t.address for pid, t in tr.items()}, num_blocks)
        stores = {pid: StateStore(root / "a" / pid, keep=2) for pid in flat}
        full = _train(job, plan, tr, stores, 0, 2 * every)
        for s in stores.values():
            assert s.flush(120)
        n = full["checkpoints"]
        size = statistics.mean(s.bytes_written / n for s in stores.values())
        write = statistics.mean(s.write_s / n for s in stores.values())
        wait = statistics.mean(s.submit_wait_s / n for s in stores.values())
        # resume figures: a peer's own directory, and a fresh peer fetching a stage from a donor
        donor = ids[0][0]
        a, b = plan.slot(0, 0).layers
        t0 = time.perf_counter()
        mine = stores[donor].load(plan.job_id, every, a, b)
        load_s = time.perf_counter() - t0
        assert mine is not None
        serve_state(tr[donor], lambda: None, lambda: None, lambda j, s0, e0, st: stores[donor].load(j, st, s0, e0))
        joiner = Transport(TransportConfig(), peer_id="joiner").start()
        try:
            joiner.connect(donor, tr[donor].address)
            t0 = time.perf_counter()
            got = fetch_state(joiner, [donor], job_id=plan.job_id, start=a, end=b, need=list(mine.params),
                              timeout=120, step=every)
            fetch_s = time.perf_counter() - t0
        finally:
            joiner.close()
        fetched_ok = digest(got.params) == digest(mine.params)
        multi = _multi_donor_fetch(plan, stores, every, (a, b), link_mbit)
        for s in stores.values():
            s.close()
    finally:
        for t in tr.values():
            t.close()

    # the resumed run: fresh workers from copies of the directories, at step `every`, to 2 * every
    for pid in flat:
        shutil.copytree(root / "a" / pid, root / "b" / pid)
    tr = transports()
    try:
        plan2 = dataclasses.replace(_plan(job, ids, {pid: t.address for pid, t in tr.items()}, num_blocks),
                                    version=2, start_step=every, resume_step=every)
        stores2 = {pid: StateStore(root / "b" / pid, keep=2) for pid in flat}
        resumed = _train(job, plan2, tr, stores2, every, 2 * every)
        for s in stores2.values():
            s.close()
    finally:
        for t in tr.values():
            t.close()
    bitwise = all(
        sorted(full["globals"][pid]) == sorted(resumed["globals"][pid])
        and all(torch.equal(full["globals"][pid][k], resumed["globals"][pid][k]) for k in full["globals"][pid])
        for pid in flat
    )
    worst = max(float((full["globals"][pid][k] - resumed["globals"][pid][k]).abs().max())
                for pid in flat for k in full["globals"][pid])
    params = sum(t.numel() for g in full["globals"].values() for t in g.values()) // 2  # two pipelines
    return {
        "bench": "checkpoint", "preset": preset, "params": params, "every": every, "checkpoints": n,
        "size_bytes": round(size), "write_s": write, "stall_s": full["stall_s"], "submit_wait_s": wait,
        "step_s": full["step_s"], "stall_over_step": full["stall_s"] / full["step_s"],
        "resume_load_s": load_s, "resume_fetch_s": fetch_s, "fetched_bitwise": fetched_ok, "multi_donor": multi,
        "resumed_from": resumed["sources"], "local_state_restored": resumed["local_restored"],
        "bitwise_resume": bitwise, "max_abs_diff": worst,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.checkpoint", description=__doc__)
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--link-mbit", type=float, default=100.0,
                    help="each donor's shaped link for the multi-donor fetch (Mbit/s)")
    ap.add_argument("--tiny", action="store_true", help="smoke mode: the tiny preset, 2 steps a round, small batches")
    args = ap.parse_args(argv)
    presets = ["tiny"] if args.tiny else [p for p in args.presets.split(",") if p]
    every, mb, mbs = (2, 2, 2) if args.tiny else (args.every, args.micro_batch, args.microbatches)
    ok = True
    for preset in presets:
        with tempfile.TemporaryDirectory(prefix="gt-bench-ckpt-") as tmp:
            line = run_preset(preset, every=every, micro_batch=mb, microbatches=mbs, root=Path(tmp),
                              link_mbit=args.link_mbit)
        ok &= line["bitwise_resume"] and line["fetched_bitwise"] and line["resumed_from"] == ["store"]
        ok &= line["multi_donor"]["one_bitwise"] and line["multi_donor"]["chunked_bitwise"]
        print(json.dumps(line), flush=True)
    print(json.dumps({"event": "summary", "ok": ok}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
