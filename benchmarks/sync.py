"""Benchmark: DiLoCo in a stage group against synchronous data parallel and hivemind's averager.

Tiny GPT on the embedded corpus, ``--replicas`` replicas in ``--regions``
regions, the same token budget for every backend:

- ``dp``: synchronous data parallel: gradients averaged every inner step (one
  process; bytes are those of a ring all-reduce of fp32 gradients, replicas
  ordered by region, so the ring crosses each region boundary once);
- ``hivemind``: flat DiLoCo on hivemind's DecentralizedAverager with fp16 (the
  OpenDiLoCo recipe; bytes from hivemind's routing and serialized part sizes);
- ``geotrain``: :class:`geotrain.sync.DiLoCoSync` (hierarchical, streaming
  fragments, ``--codec`` with error feedback) over real loopback transports;
  bytes measured at each peer's transport.

One JSON line per backend (final validation loss, cross-region bytes, total
bytes, wall time), then one ``summary`` line with the ratios of ``dp`` and
``hivemind`` to ``geotrain``. Run: ``python -m benchmarks.sync [--steps 300]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from geotrain.data import DataConfig, TokenDataset, build_dataset
from geotrain.models import GPTConfig, StageModule, build_stage
from geotrain.sync import DiLoCoConfig, DiLoCoSync, Member, StaticMembership, split_fragments
from geotrain.transport import Transport, TransportConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Setup:
    """What every backend shares: model, data, budget."""

    preset: str = "tiny"
    replicas: int = 4
    regions: int = 2
    steps: int = 300
    batch: int = 8
    lr: float = 3e-3
    seed: int = 0
    val_batches: int = 8
    data_bytes: int = 2 << 20

    def region(self, i: int) -> str:
        return f"r{i * self.regions // self.replicas}"

    @property
    def model_config(self) -> GPTConfig:
        return GPTConfig.preset(self.preset)


def build_model(setup: Setup) -> StageModule:
    cfg = setup.model_config
    return build_stage(cfg, (0, cfg.num_blocks), setup.seed)


def batch(setup: Setup, data: TokenDataset, step: int, replica: int) -> torch.Tensor:
    return data.get_batch(
        step, batch_size=setup.batch, seq_len=setup.model_config.seq_len, seed=setup.seed,
        shard=replica, num_shards=setup.replicas,
    )


def val_loss(setup: Setup, data: TokenDataset, model: StageModule) -> float:
    batches = data.val_batches(batch_size=setup.batch, seq_len=setup.model_config.seq_len, num_batches=setup.val_batches)
    with torch.no_grad():
        losses = [float(model.loss(model(b[:, :-1]), b[:, 1:])) for b in batches]
    return sum(losses) / len(losses)


def _inner_step(model: StageModule, opt: torch.optim.Optimizer, tokens: torch.Tensor) -> float:
    loss = model.loss(model(tokens[:, :-1]), tokens[:, 1:])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


def _numel(model: StageModule) -> int:
    return sum(p.numel() for p in model.parameters())


def run_dp(setup: Setup, data: TokenDataset) -> dict[str, Any]:
    t0 = time.monotonic()
    model = build_model(setup)
    opt = torch.optim.AdamW(model.parameters(), lr=setup.lr)
    for step in range(setup.steps):
        # the mean of the replicas' losses has the mean of their gradients: what an all-reduce gives each
        losses = [model.loss(model(b[:, :-1]), b[:, 1:]) for b in (batch(setup, data, step, r) for r in range(setup.replicas))]
        opt.zero_grad(set_to_none=True)
        torch.stack(losses).mean().backward()
        opt.step()
    p, n = setup.replicas, _numel(model)
    per_edge = 2 * (p - 1) / p * 4 * n  # ring all-reduce: bytes each peer sends per step, fp32
    return {
        "backend": "dp",
        "final_loss": val_loss(setup, data, model),
        "cross_region_bytes": int(setup.regions * per_edge * setup.steps) if setup.regions > 1 else 0,
        "total_bytes": int(p * per_edge * setup.steps),
        "wall_s": time.monotonic() - t0,
        "bytes_note": "ring all-reduce formula, fp32 gradients every step",
    }


def run_geotrain(setup: Setup, data: TokenDataset, config: DiLoCoConfig) -> dict[str, Any]:
    t0 = time.monotonic()
    transports = [
        Transport(TransportConfig(), peer_id=f"rep{i}", region=setup.region(i)).start() for i in range(setup.replicas)
    ]
    try:
        membership = StaticMembership([Member(t.peer_id, t.region, t.address) for t in transports])
        models = [build_model(setup) for _ in transports]
        syncs = [
            DiLoCoSync(config, params=list(m.named_parameters()), transport=t, membership=membership)
            for m, t in zip(models, transports, strict=True)
        ]

        def replica(i: int) -> None:
            opt = torch.optim.AdamW(models[i].parameters(), lr=setup.lr)
            for step in range(setup.steps):
                _inner_step(models[i], opt, batch(setup, data, step, i))
                syncs[i].after_inner_step(step + 1)
            syncs[i].flush()

        with concurrent.futures.ThreadPoolExecutor(setup.replicas) as pool:
            for f in [pool.submit(replica, i) for i in range(setup.replicas)]:
                f.result()
        final = build_model(setup)
        for frag, outer in zip(split_fragments(list(final.named_parameters()), config.fragments), syncs[0].outer, strict=True):
            frag.assign(outer.global_flat)
        identical = all(torch.equal(s.global_flat(), syncs[0].global_flat()) for s in syncs)
        history = syncs[0].history
        cross = sum(s.stats.bytes_cross for s in syncs)
        intra = sum(s.stats.bytes_intra for s in syncs)
        for s in syncs:
            s.close()
    finally:
        for t in transports:
            t.close()
    return {
        "backend": "geotrain",
        "final_loss": val_loss(setup, data, final),
        "cross_region_bytes": cross,
        "total_bytes": cross + intra,
        "wall_s": time.monotonic() - t0,
        "rounds_committed": sum(o.committed for o in history),
        "rounds_discarded": sum(not o.committed for o in history),
        "replicas_identical": identical,
        "codec": config.cross_codec,
        "intra_codec": config.intra_codec,
        "fragments": config.fragments,
        "overlap": config.overlap,
        "every": config.every,
    }


def run_hivemind(setup: Setup, data: TokenDataset, config: DiLoCoConfig, compression: str) -> dict[str, Any]:
    import hivemind

    from geotrain.sync.hivemind_backend import HivemindDiLoCoSync

    t0 = time.monotonic()
    dhts = [hivemind.DHT(start=True)]
    maddrs = dhts[0].get_visible_maddrs()
    dhts += [hivemind.DHT(start=True, initial_peers=maddrs) for _ in range(setup.replicas - 1)]
    syncs: list[HivemindDiLoCoSync] = []
    try:
        models = [build_model(setup) for _ in dhts]
        syncs = [
            HivemindDiLoCoSync(
                config, params=list(m.named_parameters()), dht=d, region=setup.region(i),
                group_size=setup.replicas, prefix="bench-diloco", compression=compression, matchmaking_s=1.0,
            )
            for i, (m, d) in enumerate(zip(models, dhts, strict=True))
        ]
        regions = {s.peer_id: setup.region(i) for i, s in enumerate(syncs)}
        for s in syncs:
            s.set_peer_regions(regions)

        def replica(i: int) -> None:
            opt = torch.optim.AdamW(models[i].parameters(), lr=setup.lr)
            for step in range(setup.steps):
                _inner_step(models[i], opt, batch(setup, data, step, i))
                syncs[i].after_inner_step(step + 1)

        with concurrent.futures.ThreadPoolExecutor(setup.replicas) as pool:
            for f in [pool.submit(replica, i) for i in range(setup.replicas)]:
                f.result()
        final = build_model(setup)
        split_fragments(list(final.named_parameters()), 1)[0].assign(syncs[0].global_flat())
        history = syncs[0].history
        cross = sum(s.stats.bytes_cross for s in syncs)
        intra = sum(s.stats.bytes_intra for s in syncs)
    finally:
        for s in syncs:
            s.shutdown()
        for d in dhts:
            d.shutdown()
    return {
        "backend": "hivemind",
        "final_loss": val_loss(setup, data, final),
        "cross_region_bytes": cross,
        "total_bytes": cross + intra,
        "wall_s": time.monotonic() - t0,
        "rounds_committed": sum(o.committed for o in history),
        "rounds_discarded": sum(not o.committed for o in history),
        "compression": compression,
        "every": config.every,
        "bytes_note": "from hivemind's butterfly routing and serialized part sizes",
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sync", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="inner steps per replica (same token budget for all)")
    p.add_argument("--every", type=int, default=100, help="H: inner steps per round")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--regions", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3, help="inner AdamW learning rate (also dp's)")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--codec", default="int4", help="geotrain cross-region codec spec")
    p.add_argument("--intra-codec", default="fp16", help="geotrain codec inside a region")
    p.add_argument("--fragments", type=int, default=2)
    p.add_argument("--overlap", type=int, default=1)
    p.add_argument("--hivemind-compression", default="fp16")
    p.add_argument("--backends", default="dp,hivemind,geotrain")
    p.add_argument("--data-bytes", type=int, default=2 << 20)
    p.add_argument("--val-batches", type=int, default=8)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(1)  # replicas are threads: one core each beats oversubscription
    setup = Setup(
        preset=args.preset, replicas=args.replicas, regions=args.regions, steps=args.steps, batch=args.batch,
        lr=args.lr, data_bytes=args.data_bytes, val_batches=args.val_batches,
    )
    data = build_dataset(DataConfig(max_bytes=setup.data_bytes))
    diloco = DiLoCoConfig(
        every=args.every, cross_codec=args.codec, intra_codec=args.intra_codec, fragments=args.fragments,
        overlap=args.overlap, deadline_floor_s=30.0,
    )
    results: dict[str, dict[str, Any]] = {}
    for name in args.backends.split(","):
        if name == "dp":
            results[name] = run_dp(setup, data)
        elif name == "geotrain":
            results[name] = run_geotrain(setup, data, diloco)
        elif name == "hivemind":
            flat = DiLoCoConfig(every=args.every, fragments=1, overlap=0, deadline_floor_s=30.0)
            results[name] = run_hivemind(setup, data, flat, args.hivemind_compression)
        else:
            raise SystemExit(f"unknown backend {name!r}; choose among dp, hivemind, geotrain")
        print(json.dumps({"event": "result", **results[name]}), flush=True)
    summary: dict[str, Any] = {"event": "summary", "steps": setup.steps, "replicas": setup.replicas,
                               "regions": setup.regions, "preset": setup.preset}
    ours = results.get("geotrain")
    if ours is not None:
        for base in ("dp", "hivemind"):
            if base in results:
                other = results[base]
                summary[f"{base}_over_geotrain_cross_bytes"] = other["cross_region_bytes"] / max(1, ours["cross_region_bytes"])
                summary[f"{base}_over_geotrain_total_bytes"] = other["total_bytes"] / max(1, ours["total_bytes"])
                summary[f"geotrain_loss_vs_{base}"] = ours["final_loss"] / other["final_loss"] - 1.0
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
