"""Contender 3, flat DiLoCo on hivemind's DecentralizedAverager (the OpenDiLoCo recipe).

Every peer trains the whole model on its own shard with AdamW; every ``H``
inner steps all peers average their pseudo-gradients (global - local) with one
flat hivemind all-reduce (fp16) and apply the outer SGD + Nesterov step, via
:class:`geotrain.sync.hivemind_backend.HivemindDiLoCoSync` (no hierarchy, no
fragments, no overlap). Rank 0 writes the global model after each round::

    python -m benchmarks.contenders.diloco --spec SPEC.json --rank R --host ADDR --region R [--initial-peers ...]

Self-counted bytes come from the backend's routing model (each part of the
vector to its owner and the averaged part back, at its serialized size);
peers publish their region on the DHT so each can tell cross-region parts.
"""

from __future__ import annotations

import argparse
import logging

import torch

from benchmarks.contenders.common import Setup, WorkerSpec, emit, stop_requested, wait_go

REGIONS_KEY_SUFFIX = "-regions"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.contenders.diloco", description=__doc__)
    p.add_argument("--spec", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--region", required=True)
    p.add_argument("--initial-peers", nargs="*", default=[])
    args = p.parse_args(argv)

    import hivemind
    from hivemind.utils import get_dht_time

    from geotrain.sync.config import DiLoCoConfig
    from geotrain.sync.hivemind_backend import HivemindDiLoCoSync

    logging.getLogger("hivemind").setLevel(logging.ERROR)
    spec = WorkerSpec.load(args.spec)
    s = Setup(spec, args.rank)
    dht = hivemind.DHT(host_maddrs=[f"/ip4/{args.host}/tcp/0"], initial_peers=args.initial_peers, start=True)
    emit({"event": "ready", "rank": args.rank, "maddrs": [str(m) for m in dht.get_visible_maddrs()]})
    sc = s.job.sync
    sync = HivemindDiLoCoSync(
        DiLoCoConfig(every=spec.every, outer_lr=sc.outer_lr, outer_momentum=sc.outer_momentum, nesterov=sc.nesterov,
                     fragments=1, overlap=0, deadline_floor_s=spec.averaging_timeout_s),
        params=list(s.model.named_parameters()),
        dht=dht,
        region=args.region,
        group_size=spec.world,
        prefix=f"{spec.run_id}-diloco",
        compression=spec.compression,
        matchmaking_s=spec.matchmaking_s,
    )
    key = spec.run_id + REGIONS_KEY_SUFFIX
    dht.store(key, subkey=sync.peer_id, value=args.region, expiration_time=get_dht_time() + 3600)
    emit({"event": "joined", "rank": args.rank})
    wait_go(spec.go_timeout_s)
    found = dht.get(key, latest=True)
    if found is not None and isinstance(found.value, dict):
        sync.set_peer_regions({str(k): str(v.value) for k, v in found.value.items()})
    s.start_clock()
    opt = s.optimizer()
    loss = float("nan")
    frag = sync.fragment
    step = 0
    stopped = "cap"
    for step in range(max(spec.max_steps, spec.steps)):
        opt.zero_grad()
        loss = s.forward_backward(step)
        opt.step()
        outcomes = sync.after_inner_step(step + 1)
        if args.rank == 0 and outcomes:
            flat = sync.global_flat()  # (numel,) the committed global parameters
            named, pos = {}, 0
            for n, q in zip(frag.names, frag.params, strict=True):
                named[n] = flat[pos : pos + q.numel()].view_as(q)
                pos += q.numel()
            s.snapshot((step + 1) * spec.world * s.tokens_per_step, named)
        if step + 1 == spec.steps:
            s.budget((step + 1) * spec.world * s.tokens_per_step)
        if stop_requested():  # sent only past the budget (the first rank to reach it); a straggler stops too, not after its own budget
            stopped = "target"
            break
        if s.elapsed() > spec.timeout_s:
            stopped = "timeout"
            break
    st = sync.stats
    s.done(steps=step + 1, tokens=(step + 1) * s.tokens_per_step, loss=loss,
           rounds_committed=st.rounds_committed, rounds_discarded=st.rounds_discarded, stopped=stopped,
           self_bytes_total=float(st.bytes_cross + st.bytes_intra), self_bytes_cross=float(st.bytes_cross),
           self_bytes_method="hivemind routing model (serialized part sizes)")
    sync.shutdown()
    dht.shutdown()
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    raise SystemExit(main())
