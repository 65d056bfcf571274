"""Contender 1, synchronous data parallel: one process per peer, gloo all-reduce of all gradients every step.

Every peer trains the same model on its own shard; after each backward the
gradients (flattened into one fp32 vector, one all-reduce per step, as a
bucketed DDP would with a single bucket) are averaged over all peers with
``torch.distributed`` (gloo), then every peer takes the same AdamW step. The
models stay identical, so rank 0's model is the global model.

Rank 0 hosts the rendezvous store on port 0 and prints the port it got;
the other ranks join with ``--master HOST:PORT``. Run by ``benchmarks.e2e``::

    python -m benchmarks.contenders.ddp --spec SPEC.json --rank R --host ADDR [--master HOST:PORT]

Self-counted bytes (used only without namespaces) follow the ring all-reduce
model: each rank sends ``2 (W - 1) / W`` times the vector per all-reduce, to
its ring successor (rank + 1); a hop between different regions is cross-region.
"""

from __future__ import annotations

import argparse
from datetime import timedelta

import torch

from benchmarks.contenders.common import Setup, WorkerSpec, emit, wait_go


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.contenders.ddp", description=__doc__)
    p.add_argument("--spec", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1", help="this peer's address")
    p.add_argument("--master", default=None, help="HOST:PORT of rank 0's store (ranks > 0)")
    args = p.parse_args(argv)

    import torch.distributed as dist

    spec = WorkerSpec.load(args.spec)
    s = Setup(spec, args.rank)
    timeout = timedelta(seconds=spec.timeout_s)
    if args.rank == 0:
        store = dist.TCPStore(args.host, 0, spec.world, is_master=True, timeout=timeout, wait_for_workers=False)
        master = f"{args.host}:{store.port}"
    else:
        if not args.master:
            p.error("--master is required for rank > 0")
        host, port = args.master.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), spec.world, is_master=False, timeout=timeout)
        master = args.master
    emit({"event": "ready", "rank": args.rank, "master": master})
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=spec.world, timeout=timeout)
    emit({"event": "joined", "rank": args.rank})
    wait_go(spec.go_timeout_s)
    dist.barrier()  # start together: the clock runs from here on every rank
    s.start_clock()

    params = [p for p in s.model.parameters() if p.requires_grad]
    for q in params:
        q.grad = torch.zeros_like(q)
    numel = sum(q.numel() for q in params)
    opt = s.optimizer(params)
    world = spec.world
    loss = float("nan")
    for step in range(spec.steps):
        for q in params:
            assert q.grad is not None
            q.grad.zero_()
        loss = s.forward_backward(step)
        flat = torch.cat([q.grad.reshape(-1) for q in params if q.grad is not None])  # (numel,)
        dist.all_reduce(flat)
        flat.div_(world)
        pos = 0
        for q in params:
            assert q.grad is not None
            q.grad.copy_(flat[pos : pos + q.numel()].view_as(q))
            pos += q.numel()
        opt.step()
        done = step + 1
        if args.rank == 0 and (done % spec.snapshot_every == 0 or done == spec.steps):
            s.snapshot(done * world * s.tokens_per_step)

    # ring model: per all-reduce each rank sends 2 (W - 1) / W of the vector to rank + 1
    per_rank = 2 * (world - 1) / world * numel * 4 * spec.steps
    ring = [spec.regions.get(str(r), "?") for r in range(world)]
    crosses = ring[args.rank] != ring[(args.rank + 1) % world]
    s.budget(spec.steps * world * s.tokens_per_step)  # DP trains exactly the budget: it sets the target
    s.done(steps=spec.steps, tokens=spec.steps * s.tokens_per_step, loss=loss,
           self_bytes_total=per_rank, self_bytes_cross=per_rank if crosses else 0.0,
           self_bytes_method="ring all-reduce model (2(W-1)/W x fp32 gradients per step)")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
