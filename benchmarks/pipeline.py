"""Pipeline throughput, measured vs the planner's prediction: ``python -m benchmarks.pipeline``.

In one run:

1. *Calibrate*: time each stage's forward + backward of one microbatch alone
   (torch on 1 thread, median of a few), which gives each stage peer's
   measured FLOP/s for the planner (profile FLOPs / measured seconds).
2. *Baseline*: the whole model in one process on 1 thread, same batch and
   microbatches, tokens/s.
3. *Pipeline*: ``--stages`` stage peers (separate processes with 1 torch thread
   each, or threads of this process with ``--mode threads``), real ZMQ on
   loopback, links optionally emulated in the transport (``--bandwidth-mbit``,
   ``--rtt-ms``). Measured tokens/s = batch tokens / median step wall time.
4. *Prediction*: ``geotrain.planner.evaluate`` on a scenario with those peers
   and links. Printed as JSON lines: measured, predicted, ratio, bubble
   fraction per stage, bytes per hop per step.

On a 2-core machine more than 2 stage processes share cores, which the
planner does not model; the output says so (``oversubscribed``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["main"]


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pipeline", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=2, help="sequences per microbatch")
    p.add_argument("--steps", type=int, default=6, help="measured steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"])
    p.add_argument("--codec", default="none", help="activation and gradient codec on every hop")
    p.add_argument("--bandwidth-mbit", type=float, default=0.0, help="emulated hop bandwidth; 0 = loopback")
    p.add_argument("--rtt-ms", type=float, default=0.0, help="emulated hop round-trip time")
    p.add_argument("--mode", default="processes", choices=["processes", "threads"])
    p.add_argument("--no-tie", action="store_true", help="untie embedding/head (no first<->last exchange)")
    return p


def _median_time(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import torch

    from geotrain.data import DataConfig, build_dataset
    from geotrain.models import GPTConfig, GPTModel, build_stage, even_split
    from geotrain.models.profile import layer_profile
    cfg = GPTConfig.preset(args.preset, tie_embeddings=not args.no_tie)
    model, seed, m_b, mbs = GPTModel(cfg), 0, args.micro_batch, args.microbatches
    layers = even_split(cfg.num_blocks, args.stages)
    ds = build_dataset(DataConfig(max_bytes=1 << 20))
    batch_size = m_b * mbs
    tokens_per_step = batch_size * cfg.seq_len
    torch.set_num_threads(1)

    # 1. calibrate each stage's compute per microbatch, as a peer's benchmark would
    mb = ds.get_batch(0, batch_size=m_b, seq_len=cfg.seq_len, seed=seed)
    x_in = {0: mb[:, :-1]}
    stage_s = []
    for s, r in enumerate(layers):
        st = build_stage(model, r, seed)
        x = x_in[s]

        def fwd_bwd(st: Any = st, x: torch.Tensor = x) -> None:
            inp = x.detach().requires_grad_(True) if x.is_floating_point() else x
            out = st(inp)
            (st.loss(out, mb[:, 1:]) if st.is_last else out.float().square().mean()).backward()

        fwd_bwd()
        stage_s.append(_median_time(fwd_bwd, 5))
        with torch.no_grad():
            x_in[s + 1] = st(x)
    prof = layer_profile(cfg)
    flops = [m_b * cfg.seq_len * sum(p.flops_per_token for p in prof[a:b]) for a, b in layers]
    _emit(bench="pipeline", line="calibration", stage_compute_s=stage_s,
          stage_tflops=[f / t / 1e12 for f, t in zip(flops, stage_s, strict=True)])

    # 2. baseline: the whole model in one process, same microbatches
    full = build_stage(model, (0, cfg.num_blocks), seed)
    opt = torch.optim.AdamW(full.parameters(), lr=3e-4)

    def one_step(step: int) -> None:
        for chunk in ds.get_batch(step, batch_size=batch_size, seq_len=cfg.seq_len, seed=seed).chunk(mbs):
            (full.loss(full(chunk[:, :-1]), chunk[:, 1:]) / mbs).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    one_step(0)
    base_s = statistics.median(_median_time(lambda s=s: one_step(s), 1) for s in range(1, 1 + max(2, args.steps // 2)))
    baseline_tps = tokens_per_step / base_s

    # 3. the pipeline
    total = args.warmup + args.steps
    if args.mode == "threads":
        per_stage = _run_threads(args, model, layers, ds, batch_size, cfg.seq_len, total)
    else:
        per_stage = _run_processes(args, layers, total)
    walls = [m["wall_s"] for m in per_stage[-1][args.warmup:]]
    measured_tps = tokens_per_step / statistics.median(walls)

    # 4. the planner's prediction for the same peers, links and compute
    last_steps = [stage[args.warmup:] for stage in per_stage]
    in_run_s = [statistics.median(m["compute_s"] for m in st) / mbs for st in last_steps]
    pred = _predict(args, cfg, prof, layers, flops, stage_s)
    # the same model fed with the compute each stage really got during the run (cores are shared here)
    pred_in_run = _predict(args, cfg, prof, layers, flops, in_run_s)
    hop_bytes = {
        f"{s}->{s + 1}": statistics.median(m["bytes_sent"].get(_peer(args, s + 1), 0) for m in last_steps[s])
        for s in range(args.stages - 1)
    }
    _emit(
        bench="pipeline", line="result", mode=args.mode, preset=args.preset, stages=args.stages,
        schedule=args.schedule, microbatches=mbs, micro_batch=m_b, codec=args.codec,
        bandwidth_mbit=args.bandwidth_mbit or None, rtt_ms=args.rtt_ms or None,
        measured_tokens_per_s=measured_tps, predicted_tokens_per_s=pred.tokens_per_s,
        ratio=measured_tps / pred.tokens_per_s, predicted_bottleneck=pred.bottleneck,
        predicted_in_run_tokens_per_s=pred_in_run.tokens_per_s, ratio_in_run=measured_tps / pred_in_run.tokens_per_s,
        baseline_single_process_tokens_per_s=baseline_tps, speedup_vs_single_process=measured_tps / baseline_tps,
        bubble_fraction=[statistics.median(m["bubble_fraction"] for m in st) for st in last_steps],
        stage_compute_s_per_step=[statistics.median(m["compute_s"] for m in st) for st in last_steps],
        stage_optimizer_s_per_step=[statistics.median(m["optimizer_s"] for m in st) for st in last_steps],
        calibrated_compute_s_per_step=[mbs * c for c in stage_s],
        predicted_step_s=pred.step_s, predicted_in_run_step_s=pred_in_run.step_s,
        measured_step_s=statistics.median(walls),
        bytes_per_hop_per_step=hop_bytes, loss_last=per_stage[-1][-1]["loss"],
        oversubscribed=args.mode == "processes" and args.stages > (os.cpu_count() or 1),
    )
    return 0


def _predict(args: argparse.Namespace, cfg: Any, prof: list[Any], layers: list[tuple[int, int]],
             flops: list[float], stage_s: list[float]) -> Any:
    """The cost model's prediction for one pipeline whose stage s does ``flops[s]`` in ``stage_s[s]`` seconds."""
    from geotrain.planner import Job, Link, ModelSpec, Peer, Region, Scenario, StageAssignment, evaluate

    n = len(layers)
    emulated = args.bandwidth_mbit > 0 or args.rtt_ms > 0
    bw_gbps = args.bandwidth_mbit / 1e3 if args.bandwidth_mbit > 0 else 10.0  # loopback: effectively unbounded
    rtt_ms = args.rtt_ms if emulated else 0.05
    scenario = Scenario(
        regions={f"r{s}": Region(name=f"r{s}") for s in range(n)},
        links=tuple(Link(a=f"r{a}", b=f"r{b}", bandwidth_gbps=bw_gbps, rtt_ms=rtt_ms)
                    for a in range(n) for b in range(a, n)),
        peers=tuple(Peer(id=f"p{s}", region=f"r{s}", tflops=flops[s] / stage_s[s] / 1e12, memory_gb=64.0)
                    for s in range(n)),
        model=ModelSpec(profile=tuple(prof), seq_len=cfg.seq_len, dtype_bytes=4),
        job=Job(micro_batch=args.micro_batch, micro_batches=args.microbatches, sync_every=1, stages=n, pipelines=1,
                activation_codec=args.codec),
    )
    return evaluate(scenario, [[StageAssignment(peer=f"p{s}", layers=r) for s, r in enumerate(layers)]],
                    check_memory=False)


def _peer(args: argparse.Namespace, s: int) -> str:
    return f"w{s}" if args.mode == "processes" else f"bench-s{s}"


def _run_threads(args: argparse.Namespace, model: Any, layers: list[tuple[int, int]], ds: Any, batch_size: int,
                 seq_len: int, total: int) -> list[list[dict[str, Any]]]:
    from geotrain.pipeline import LocalPipeline, StageConfig

    emulator = None
    if args.bandwidth_mbit > 0 or args.rtt_ms > 0:
        from geotrain.emulate.links import LinkEmulator, LinkEmulatorConfig, LinkPath

        path = LinkPath(delay_s=args.rtt_ms / 2e3, bandwidth_bps=args.bandwidth_mbit * 1e6 / 8 or None)

        def emulator(s: int) -> LinkEmulator:
            here = f"r{s}"
            return LinkEmulator(LinkEmulatorConfig(
                local_region=here, paths={(here, f"r{o}"): path for o in range(len(layers)) if o != s}))

    cfg = StageConfig(job="bench", stage=0, num_stages=len(layers), microbatches=args.microbatches,
                      schedule=args.schedule)
    out: list[list[dict[str, Any]]] = [[] for _ in layers]
    with LocalPipeline(model, layers, cfg, seed=0, name="bench", emulator=emulator,
                       codecs=[(args.codec, args.codec)] * (len(layers) - 1),
                       data=lambda s: ds.get_batch(s, batch_size=batch_size, seq_len=seq_len, seed=0)) as pp:
        for step in range(total):
            for s, m in enumerate(pp.step(step)):
                out[s].append(m.to_json())
    return out


def _run_processes(args: argparse.Namespace, layers: list[tuple[int, int]], total: int) -> list[list[dict[str, Any]]]:
    from geotrain.local.procs import ChildGroup
    from geotrain.transport import Message, Transport, TransportConfig

    n = len(layers)
    with ChildGroup() as group:
        procs = []
        for s in range(n):
            argv = [
                "--peer-id", f"w{s}", "--stage", str(s), "--num-stages", str(n), "--model", args.preset,
                "--steps", str(total), "--batch-size", str(args.micro_batch * args.microbatches),
                "--microbatches", str(args.microbatches), "--schedule", args.schedule, "--threads", "1",
                "--act-codec", args.codec, "--grad-codec", args.codec, "--data-bytes", str(1 << 20),
                "--bandwidth-mbit", str(args.bandwidth_mbit), "--rtt-ms", str(args.rtt_ms),
            ]
            if args.no_tie:
                argv.append("--no-tie")
            procs.append(group.start(f"w{s}", argv, module="geotrain.pipeline.worker"))
        ready = [p.wait_event("ready", timeout=120) for p in procs]
        table = {r["peer"]: r["address"] for r in ready}
        with Transport(TransportConfig(), peer_id="bench-launcher").start() as t:
            for pid, addr in table.items():
                t.connect(pid, addr)
                t.request(pid, Message(kind="pp.wire", meta={"peers": table}), timeout=60)
        out = [[p.wait_event("step", timeout=600) for _ in range(total)] for p in procs]
        for p in procs:
            p.wait_event("done", timeout=60)
    return out


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
