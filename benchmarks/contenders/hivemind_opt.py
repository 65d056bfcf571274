"""Contender 2, ``hivemind.Optimizer`` in its collaborative large-batch mode: one process per peer.

Every peer runs forward/backward on its own shard and hands gradients to
``hivemind.Optimizer`` (``use_local_updates=False``): the swarm accumulates
``target_batch_size`` samples, all-reduces the gradients over hivemind's
DecentralizedAverager (fp16) and every peer takes the same AdamW step. One
such global step is an *epoch* in hivemind's words. Peers stop after
``spec.epochs`` epochs, i.e. once the swarm has consumed the token budget.
After each epoch the peers' parameters agree, so any peer's model is the
global model: every peer writes a snapshot whenever its epoch advances (a
peer that lags loads the swarm's state and skips epochs, so no one peer sees
them all) and the first to reach the budget's epoch announces the budget.

Rank 0 starts the DHT on its address (port 0) and prints its multiaddrs;
the others bootstrap from them::

    python -m benchmarks.contenders.hivemind_opt --spec SPEC.json --rank R --host ADDR [--initial-peers MADDR ...]

hivemind reports no byte counts per link, so this contender has no
self-counted bytes (``null``): only the kernel counters (namespaces) measure it.
"""

from __future__ import annotations

import argparse
import logging

import torch

from benchmarks.contenders.common import Setup, WorkerSpec, emit, stop_requested, wait_go


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.contenders.hivemind_opt", description=__doc__)
    p.add_argument("--spec", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--initial-peers", nargs="*", default=[])
    args = p.parse_args(argv)

    import hivemind
    from hivemind.compression import Float16Compression

    logging.getLogger("hivemind").setLevel(logging.ERROR)
    spec = WorkerSpec.load(args.spec)
    s = Setup(spec, args.rank)
    dht = hivemind.DHT(host_maddrs=[f"/ip4/{args.host}/tcp/0"], initial_peers=args.initial_peers, start=True)
    emit({"event": "ready", "rank": args.rank, "maddrs": [str(m) for m in dht.get_visible_maddrs()]})
    o = s.job.optimizer
    opt = hivemind.Optimizer(
        dht=dht,
        run_id=f"{spec.run_id}-hivemind",
        params=s.model.parameters(),
        optimizer=lambda ps: torch.optim.AdamW(ps, lr=o.lr, weight_decay=o.weight_decay, betas=(o.beta1, o.beta2)),
        batch_size_per_step=s.batch_size,
        target_batch_size=spec.target_batch_size,
        matchmaking_time=spec.matchmaking_s,
        averaging_timeout=spec.averaging_timeout_s,
        load_state_timeout=spec.averaging_timeout_s,
        use_local_updates=False,
        grad_compression=Float16Compression(),
        state_averaging_compression=Float16Compression(),
        verbose=False,
    )
    emit({"event": "joined", "rank": args.rank})
    wait_go(spec.go_timeout_s)
    s.start_clock()
    step, epoch, loss = 0, opt.local_epoch, float("nan")
    tokens_per_epoch = spec.target_batch_size * s.seq_len
    timed_out, stopped, budgeted = False, "cap", False
    while opt.local_epoch < max(spec.max_epochs, spec.epochs):
        opt.zero_grad()
        loss = s.forward_backward(step)
        opt.step()
        step += 1
        if opt.local_epoch != epoch:
            epoch = opt.local_epoch
            s.snapshot(epoch * tokens_per_epoch)
            if epoch >= spec.epochs and not budgeted:
                budgeted = True
                s.budget(epoch * tokens_per_epoch)
        if stop_requested():  # sent only past the budget (the first rank to reach it); a straggler stops too
            stopped = "target"
            break
        if s.elapsed() > spec.timeout_s:
            timed_out, stopped = True, "timeout"
            break
    s.done(steps=step, tokens=step * s.tokens_per_step, loss=loss, epochs=opt.local_epoch, timed_out=timed_out, stopped=stopped,
           self_bytes_total=None, self_bytes_cross=None, self_bytes_method="none (hivemind reports no bytes)")
    opt.shutdown()
    dht.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
