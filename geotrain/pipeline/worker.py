"""One stage as its own process, for multi-process tests and benchmarks without a swarm.

``python -m geotrain.pipeline.worker --peer-id s1 --stage 1 --num-stages 3 ...``

Protocol (JSON lines on stdout, the entry-point convention of ``geotrain.cli``):

1. ``{"event": "ready", "peer": ..., "address": ...}`` once the transport is bound;
2. the launcher sends a ``pp.wire`` request whose meta is ``{"peers": {peer_id: address}}``
   for the pipeline's peers in stage order; the worker connects and replies;
3. one ``{"event": "step", ...StepMetrics}`` line per inner step, then ``{"event": "done"}``;
   on a neighbour failure ``{"event": "failed", "peer": ..., "step": ..., "error": ...}`` and exit code 3.

The real peer agent (``geotrain peer``) gets the same information from the plan on the DHT instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]


def _emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m geotrain.pipeline.worker", description=__doc__.splitlines()[0])
    p.add_argument("--peer-id", required=True)
    p.add_argument("--stage", type=int, required=True)
    p.add_argument("--num-stages", type=int, required=True)
    p.add_argument("--layers", default="", help="start,end block range; default: an even split")
    p.add_argument("--model", default="tiny", help="GPT preset or module:function")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--job", default="worker-job")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    p.add_argument("--act-codec", default="none")
    p.add_argument("--grad-codec", default="none")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--hop-timeout", type=float, default=30.0)
    p.add_argument("--wire-timeout", type=float, default=60.0)
    p.add_argument("--data-bytes", type=int, default=512 << 10)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--no-tie", action="store_true", help="untie the GPT preset's embedding and head")
    p.add_argument("--hf-config", default="", help="a Hugging Face config.json (or its directory) to build instead of --model")
    p.add_argument("--bandwidth-mbit", type=float, default=0.0,
                   help="emulate this bandwidth (Mbit/s) on every hop in the transport (0: none). EMULATION ONLY")
    p.add_argument("--rtt-ms", type=float, default=0.0, help="emulated round-trip time of every hop")
    return p


#: how long the first inner step may wait for a neighbour (its start-up included), whatever --hop-timeout says
FIRST_STEP_TIMEOUT_S = 60.0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import torch

    from geotrain.data import DataConfig, build_dataset
    from geotrain.errors import StageFailedError
    from geotrain.models import build_stage, even_split, resolve_model
    from geotrain.pipeline.config import StageConfig
    from geotrain.pipeline.runtime import StageRuntime
    from geotrain.transport import Message, Transport, TransportConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.hf_config:
        from geotrain.models import HFModel

        model = resolve_model(HFModel.from_config(args.hf_config, seed=args.seed))
    elif args.no_tie and ":" not in args.model:
        from geotrain.models import GPTConfig

        model = resolve_model(GPTConfig.preset(args.model, tie_embeddings=False))
    else:
        model = resolve_model(args.model, seed=args.seed)
    layers = (
        tuple(int(v) for v in args.layers.split(","))
        if args.layers
        else even_split(model.num_blocks, args.num_stages)[args.stage]
    )
    stage = build_stage(model, (layers[0], layers[1]), args.seed)
    cfg = StageConfig(
        job=args.job, stage=args.stage, num_stages=args.num_stages, microbatches=args.microbatches,
        schedule=args.schedule, act_codec=args.act_codec, grad_codec=args.grad_codec, lr=args.lr,
        # the first step also waits out the neighbours' own start (first forward, lazy init, a loaded box):
        # the hop deadline applies from step 1 on
        hop_timeout_s=max(args.hop_timeout, FIRST_STEP_TIMEOUT_S),
    )
    seq_len = int(getattr(model, "seq_len", 0) or getattr(getattr(model, "config", None), "seq_len", 32))
    dataset = build_dataset(DataConfig(max_bytes=args.data_bytes)) if cfg.is_first or cfg.is_last else None

    def data(step: int) -> torch.Tensor:
        assert dataset is not None
        return dataset.get_batch(step, batch_size=args.batch_size, seq_len=seq_len, seed=args.seed)

    wired = threading.Event()
    table: dict[str, str] = {}

    def on_wire(msg: Message) -> Message:
        table.update({str(k): str(v) for k, v in dict(msg.meta.get("peers", {})).items()})
        wired.set()
        return Message(kind="pp.wired")

    emulator = None
    if args.bandwidth_mbit > 0 or args.rtt_ms > 0:
        from geotrain.emulate.links import LinkEmulator, LinkEmulatorConfig, LinkPath

        # every stage is its own region r{s}; every other stage is one emulated hop away
        path = LinkPath(delay_s=args.rtt_ms / 2e3, bandwidth_bps=args.bandwidth_mbit * 1e6 / 8 or None)
        here = f"r{args.stage}"
        emulator = LinkEmulator(LinkEmulatorConfig(
            local_region=here, paths={(here, f"r{o}"): path for o in range(args.num_stages) if o != args.stage}))
    with Transport(TransportConfig(), peer_id=args.peer_id, region=f"r{args.stage}", emulator=emulator) as transport:
        transport.serve("pp.wire", on_wire)
        transport.set_context(job=args.job, plan_version=0)
        _emit("ready", peer=args.peer_id, address=transport.address, layers=list(layers))
        if not wired.wait(args.wire_timeout):
            _emit("failed", peer=None, step=None, error=f"no pp.wire within {args.wire_timeout}s")
            return 3
        order = list(table)
        if len(order) != args.num_stages:
            _emit("failed", peer=None, step=None, error=f"pp.wire named {len(order)} peers for {args.num_stages} stages")
            return 3
        for o, pid in enumerate(order):
            if pid != args.peer_id:
                transport.connect(pid, table[pid], region=f"r{o}")
        s, n = args.stage, args.num_stages
        runtime = StageRuntime(
            cfg, stage=stage, transport=transport,
            prev_peer=order[s - 1] if s > 0 else None,
            next_peer=order[s + 1] if s < n - 1 else None,
            end_peer=order[n - 1 - s] if s in (0, n - 1) and n > 1 else None,
            data=data if cfg.is_first or cfg.is_last else None,
        )
        try:
            for step in range(args.steps):
                metrics = runtime.run_inner_step(step)
                if step == 0:
                    runtime.config = dataclasses.replace(cfg, hop_timeout_s=args.hop_timeout)
                _emit("step", **metrics.to_json())
        except StageFailedError as e:
            _emit("failed", peer=e.peer, step=e.step, error=str(e))
            return 3
        finally:
            runtime.close()
        _emit("done", peer=args.peer_id)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
