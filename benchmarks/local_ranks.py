"""Local ranks: one peer's stage on N ranks (``--nproc-per-node``) against the same stage on one rank.

What it measures, in one run: inner steps per second of one stage (the whole model by default) trained by
one process, and by N local ranks (rank 0 plus N - 1 helper processes, :mod:`geotrain.peers.ranks`) on
the same batches; the ratio; and the node-internal traffic the ranks cost per step (tensor bytes rank 0
sends to and receives from its helpers: microbatch chunks, outputs and their gradients, one gradient
reduce and one weight broadcast) and per microbatch. On a CPU the ranks share its cores: the ratio then
measures the ranks' overhead, not a speed-up (``--threads`` per rank; one rank gets N x that). With one GPU
per rank (``--device cuda``) it is the multi-GPU peer's scaling. It also checks the two runs' weights agree.

    python -m benchmarks.local_ranks [--ranks 2] [--preset tiny|small] [--steps 20] [--device cpu|cuda]

Prints one JSON line per configuration and a summary line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from typing import Any

import torch


def _run(args: argparse.Namespace, ranks: Any, threads: int) -> dict[str, Any]:
    from geotrain.config import ModelSection
    from geotrain.pipeline import StageConfig
    from geotrain.pipeline.local import LocalPipeline

    torch.set_num_threads(threads)
    section = ModelSection(preset=args.preset)
    model = section.block_model(0)
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 256, (args.batch, section.context + 1), generator=gen) for _ in range(args.steps)]
    config = StageConfig(job="bench", stage=0, num_stages=1, microbatches=args.microbatches, lr=1e-3)
    local = {0: (ranks, section)} if ranks is not None else None
    with LocalPipeline(model, [(0, model.num_blocks)], config, seed=0, data=lambda s: batches[s], local=local,
                       optimizer=lambda st: torch.optim.SGD(st.parameters(), lr=0.1)) as pp:
        pp.step(0)  # warm-up (allocations, the helpers' first kernels)
        moved0 = ranks.bytes_moved if ranks is not None else 0
        t0 = time.perf_counter()
        compute = 0.0
        for step in range(1, args.steps):
            compute += pp.step(step)[0].compute_s
        wall = time.perf_counter() - t0
        weights = torch.cat([p.detach().reshape(-1) for p in pp.stages[0].parameters()])
    steps = args.steps - 1
    moved = (ranks.bytes_moved - moved0) if ranks is not None else 0
    return {
        "event": "result", "ranks": 1 if ranks is None else ranks.size, "threads_per_rank": threads,
        "preset": args.preset, "device": args.device, "steps": steps, "steps_per_s": steps / wall,
        "compute_s_per_step": compute / steps, "local_bytes_per_step": moved / steps,
        "local_bytes_per_microbatch": moved / steps / args.microbatches, "_weights": weights,
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.local_ranks", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per rank (one rank gets ranks x this)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (one GPU per rank: cuda:0 .. cuda:N-1)")
    args = p.parse_args(argv)
    from geotrain.peers.ranks import LocalRanks, resolve_devices

    devices = resolve_devices(args.device, args.ranks)
    one = _run(args, None, args.threads * args.ranks)
    ranks = LocalRanks(devices, threads=args.threads).start()
    try:
        many = _run(args, ranks, args.threads)
    finally:
        ranks.close()
    agree = float((one.pop("_weights") - many.pop("_weights")).abs().max())
    for line in (one, many):
        print(json.dumps(line), flush=True)
    print(json.dumps({
        "event": "summary", "ranks": args.ranks, "steps_per_s_ratio": many["steps_per_s"] / one["steps_per_s"],
        "local_bytes_per_step": many["local_bytes_per_step"], "max_weight_difference": agree,
    }), flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
