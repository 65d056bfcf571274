"""Stage workers on one device: pipelines x stages of real StageWorkers over loopback transports.

What it measures: the training path a peer runs (pipeline runtime with per-hop
codecs, DiLoCo rounds in stage groups, state snapshots), without the DHT: all
workers of the plan live in this process, one thread each, every one with its
own ZMQ transport on loopback. The baseline, in the same run, is the same
model trained by one plain loop on the same device and the same data
(tokens/s ratio). It also checks that every stage group's members hold
bit-identical global parameters after the last round.

    python -m benchmarks.workers [--device cpu|cuda] [--preset tiny|small|medium]
        [--pipelines 2] [--stages 2] [--steps 20] [--every 5]

Prints one JSON line per configuration and a summary line.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch


def _plan(job: Any, peers: list[list[str]], endpoints: dict[str, str], num_blocks: int) -> Any:
    from geotrain.models import even_split
    from geotrain.plan import JobPlan, StageSlot

    ranges = even_split(num_blocks, len(peers[0]))
    pipelines = tuple(
        tuple(
            StageSlot(peer=pid, start=a, end=b, endpoint=endpoints[pid], region=f"r{p}")
            for pid, (a, b) in zip(pipe, ranges, strict=True)
        )
        for p, pipe in enumerate(peers)
    )
    return JobPlan(job_id="bench", version=1, pipelines=pipelines, num_blocks=num_blocks,
                   sync_codec=job.sync.codec, stop_step=job.stop.steps,
                   hop_codecs=tuple(tuple(("none", "none") for _ in pipe[:-1]) for pipe in peers))


def run_workers(job: Any, *, pipelines: int, stages: int, device: str) -> dict[str, Any]:
    from geotrain.peers.worker import StageWorker
    from geotrain.transport import Transport, TransportConfig

    ids = [[f"p{p}s{s}" for s in range(stages)] for p in range(pipelines)]
    transports = {pid: Transport(TransportConfig(), peer_id=pid, region=f"r{p}").start()
                  for p, row in enumerate(ids) for pid in row}
    try:
        num_blocks = job.model.block_model(job.job.seed).num_blocks
        plan = _plan(job, ids, {pid: t.address for pid, t in transports.items()}, num_blocks)
        workers = {pid: StageWorker(job, plan, peer_id=pid, transport=t, device=device) for pid, t in transports.items()}
        losses: dict[str, list[float]] = {}
        errors: list[BaseException] = []
        path = {"hop_bytes": 0, "send_busy_s": 0.0, "recv_wait_s": 0.0, "compute_s": 0.0}  # the data path's figures

        def drive(pid: str) -> None:
            try:
                for step in range(job.stop.steps):
                    m = workers[pid].step(step)
                    path["hop_bytes"] += sum(m.bytes_sent.values())
                    path["send_busy_s"] += m.send_busy_s
                    path["recv_wait_s"] += m.recv_wait_s
                    path["compute_s"] += m.compute_s
                    if m.loss is not None:
                        losses.setdefault(pid, []).append(m.loss)
            except BaseException as e:  # reported by the caller after join
                errors.append(e)

        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        threads = [threading.Thread(target=drive, args=(pid,)) for pid in workers]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        if errors:
            raise errors[0]
        identical = True
        for g in plan.sync_groups():
            states = [workers[m].state().params for m in g.members]
            identical &= all(torch.equal(states[0][n], s[n]) for s in states[1:] for n in states[0])
        tokens = sum(w.tokens for w in workers.values() if w.stage.is_last)
        rounds = min(w.round for w in workers.values())
        for w in workers.values():
            w.close()
        last = [v[-1] for v in losses.values()]
        first = [v[0] for v in losses.values()]
        # per microbatch and stage: bytes through host memory over the hops (activations forward, gradients
        # back, tied gradients, targets), the sender threads' encode + hand-off time, the wait for neighbours
        per = job.stop.steps * job.pipeline.microbatches * len(workers)
        return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "rounds": rounds,
                "loss_first": sum(first) / len(first), "loss_last": sum(last) / len(last),
                "group_globals_identical": identical,
                "hop_bytes_per_microbatch": path["hop_bytes"] / per,
                "send_busy_ms_per_microbatch": 1e3 * path["send_busy_s"] / per,
                "recv_wait_ms_per_microbatch": 1e3 * path["recv_wait_s"] / per,
                "compute_ms_per_microbatch": 1e3 * path["compute_s"] / per}
    finally:
        for t in transports.values():
            t.close()


def run_baseline(job: Any, *, device: str, steps: int) -> dict[str, Any]:
    """One plain loop: the whole model, the same batch size per step, AdamW."""
    from geotrain.data.job import dataset_for
    from geotrain.models import build_stage
    from geotrain.pipeline.optim import inner_adamw

    model = job.model.block_model(job.job.seed)
    full = build_stage(model, (0, model.num_blocks), job.job.seed).to(device)
    opt = inner_adamw(full.parameters(), lr=job.optimizer.lr, weight_decay=job.optimizer.weight_decay)
    ds = dataset_for(job)
    batch = job.pipeline.micro_batch_size * job.pipeline.microbatches
    tokens = 0
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for step in range(steps):
        b = ds.get_batch(step, batch_size=batch, seq_len=job.model.context, seed=job.job.seed).to(device)
        loss = full.loss(full(b[:, :-1]), b[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens += b[:, 1:].numel()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "loss_last": float(loss.detach())}


def main(argv: Sequence[str] | None = None) -> int:
    from geotrain.config import job_from_dict

    ap = argparse.ArgumentParser(prog="python -m benchmarks.workers", description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--pipelines", type=int, default=2)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--codec", default="int8")
    args = ap.parse_args(argv)
    job = job_from_dict({
        "job": {"name": "bench", "seed": 0},
        "model": {"preset": args.preset},
        "data": {"max_bytes": 2 << 20},
        "pipeline": {"stages": args.stages, "pipelines": args.pipelines, "micro_batch_size": args.micro_batch,
                     "microbatches": args.microbatches},
        "sync": {"every": args.every, "codec": args.codec},
        "stop": {"steps": args.steps},
        "swarm": {"hop_timeout_s": 120, "round_timeout_s": 120},
    })
    res = run_workers(job, pipelines=args.pipelines, stages=args.stages, device=args.device)
    base = run_baseline(job, device=args.device, steps=args.steps)
    line = {"bench": "workers", "device": args.device,
            "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
            "preset": args.preset, "pipelines": args.pipelines, "stages": args.stages, "steps": args.steps,
            "every": args.every, "codec": args.codec, **res,
            "baseline_tokens_per_s": base["tokens_per_s"], "baseline_loss_last": base["loss_last"],
            "ratio_to_single_loop": res["tokens_per_s"] / base["tokens_per_s"]}
    print(json.dumps(line), flush=True)
    ok = res["group_globals_identical"] and res["loss_last"] < res["loss_first"]
    print(json.dumps({"event": "summary", "ok": ok}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
