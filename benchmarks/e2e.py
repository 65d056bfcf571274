"""End-to-end benchmark: geotrain against sync DP, hivemind.Optimizer and flat DiLoCo on emulated regions.

The same model (the job's GPT), data (the embedded corpus, one shard per peer
or pipeline), token budget and emulated links for every contender, run back to
back in one invocation; peers are put in the scenario's regions round-robin:

1. ``ddp``: synchronous data parallel, gloo all-reduce of the gradients every step;
2. ``hivemind``: ``hivemind.Optimizer``, collaborative large-batch mode;
3. ``diloco``: flat DiLoCo on hivemind's DecentralizedAverager (the OpenDiLoCo recipe);
4. ``geotrain``: planned pipelines + hierarchical DiLoCo + codecs (``geotrain dht/peer/run``).

Links: with namespaces (root; ``--netns auto|on``) every region is a network
namespace and the kernel shapes each region pair's bandwidth (htb) for every
contender alike. This kernel has no ``netem``, so the one-way delay comes from
the delay layer (``geotrain.emulate.delay``): a process in the router namespace
holds every packet between two regions for the link's one-way delay, below
every contender alike (``--delay kernel``, the default where ``/dev/net/tun``
exists); geotrain's transport then adds no delay of its own, so nobody pays
twice. With ``--delay transport`` (or without a TUN device) the delay is added
only inside geotrain's transport and gloo/hivemind traffic gets none. Without
namespaces (``off``) everything runs on loopback: geotrain's transport
emulates delay and bandwidth and contenders 1-3 run unshaped. The config line
says which delay method is active (``delay_method``).

Bytes: with namespaces, cross-region bytes are the htb counters of every region
pair and intra-region bytes the ``lo`` counters of every region, read when the
contender's training starts and ends (``bytes_method``); what each contender
counts itself is reported beside them (``self_counted``). Setup traffic before
training (DHT bootstrap, geotrain's link probes) is reported apart.

Regime (``--regime NAME|FILE``): a calibration run measures this machine's
step of the benchmark's model under its load, and every emulated link gets
the bandwidth and delay that give the regime's DP communication-to-compute
and RTT-to-step ratios (``geotrain.emulate.regime``); the mapping is the first
JSON line (``event: regime``).

Past the budget: contenders other than DP keep training until a checkpoint
reaches the target loss (geotrain: also flat DiLoCo's best) or ``--cap`` x the
budget; the fixed-budget figures are read at the budget, the whole run is
``extended``.

Per contender one JSON line (``event: contender``): wall time to the target
validation loss (the loss contender 1 reaches at the budget, from checkpoints
of the global model), validation loss at the budget,
cross-region and total bytes, compute utilisation (fraction of training wall
time in forward/backward), USD (peers' prices x wall time + egress x
cross-region bytes); then ``event: summary`` with geotrain's ratios.

Run: ``python -m benchmarks.e2e`` (full, ~15 min here) or ``--smoke`` (< 3 min).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

ALL = ("ddp", "hivemind", "diloco", "geotrain")
LABELS = {
    "ddp": "synchronous data parallel (torch.distributed gloo, gradient all-reduce every step)",
    "hivemind": "hivemind.Optimizer (collaborative large-batch mode, fp16 gradient all-reduce)",
    "diloco": "flat DiLoCo on hivemind DecentralizedAverager (OpenDiLoCo recipe, fp16)",
    "geotrain": "geotrain (planned pipelines + hierarchical DiLoCo + codecs)",
}
TARGETS = {"speedup_vs_ddp": 10.0, "speedup_vs_diloco": 1.5, "cross_region_bytes_ratio_vs_ddp": 1000.0,
           "compute_utilisation": 0.95}


GPT_PRESETS = ("tiny", "small")
HF_PRESETS = {"tiny-llama": Path(__file__).resolve().parent.parent / "examples" / "models" / "tiny-llama"}
HF_SEQ_LEN, BYTE_VOCAB = 32, 256  # the job's data is the byte-level standard-library corpus


def _say(line: dict[str, Any]) -> None:
    from benchmarks.contenders.results import rounded

    print(json.dumps(rounded(line), default=str), flush=True)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default=None, help="scenario JSON (regions, links, peers' prices); default: the demo's")
    p.add_argument("--budget-tokens", type=int, default=None, help="tokens every contender trains on")
    p.add_argument("--peers", type=int, default=None, help="peers per contender (default 6; smoke 3)")
    p.add_argument("--preset", default=None, choices=(*GPT_PRESETS, *HF_PRESETS),
                   help="model (default tiny): the reference GPT's tiny or small preset, or tiny-llama "
                        "(examples/models/tiny-llama, a transformers Llama)")
    p.add_argument("--hf-config", default=None, metavar="PATH",
                   help="train this Hugging Face causal LM (a config.json or its directory) instead of a preset")
    p.add_argument("--smoke", action="store_true", help="tiny sizes for CI (< 3 minutes)")
    p.add_argument("--contenders", default=",".join(ALL), help=f"comma-separated subset of {','.join(ALL)}")
    p.add_argument("--netns", default="auto", choices=("auto", "on", "off"),
                   help="regions as network namespaces (root): auto = when root")
    p.add_argument("--delay", default="auto", choices=("auto", "kernel", "transport"),
                   help="where the links' delay is added: kernel = the delay layer below every contender "
                        "(namespaces + /dev/net/tun), transport = geotrain's transport only; auto = kernel when possible")
    p.add_argument("--scale", type=float, default=1.0, help="divide every emulated bandwidth by this")
    p.add_argument("--regime", default=None, metavar="NAME|FILE",
                   help="emulate a deployment's ratios (built in: 1b-h100-1gbit, consumer-80mbit; or a JSON file): "
                        "every link's bandwidth and delay come from a calibration run (time dilation)")
    p.add_argument("--every", type=int, default=None, help="DiLoCo H for geotrain and flat DiLoCo (default 10; smoke 5)")
    p.add_argument("--codec", default="int8", help="geotrain's cross-region pseudo-gradient codec")
    p.add_argument("--outer-lr", type=float, default=None,
                   help="outer learning rate of geotrain and flat DiLoCo alike (default: the job's, 0.7)")
    p.add_argument("--fragments", type=int, default=1, help="geotrain's streaming fragments")
    p.add_argument("--overlap", type=int, default=None,
                   help="geotrain's overlap tau (inner steps a round hides behind; default H/2, 0 blocks)")
    p.add_argument("--stages", type=int, default=None,
                   help="geotrain's pipeline stages (default 2 when every region has >= 2 peers, else 1)")
    p.add_argument("--cap", type=float, default=None,
                   help="contenders other than DP train past the budget until they reach the target loss, at most "
                        "CAP x the budget (default 4; smoke 2)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds allowed per contender at the budget (x CAP for those that train past it)")
    p.add_argument("--work-dir", default=None, help="keep snapshots, logs and reports here (default: a temp dir)")
    args = p.parse_args(argv)
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    bad = [c for c in args.contenders if c not in ALL]
    if bad:
        p.error(f"unknown contender(s) {bad}; choose from {','.join(ALL)}")
    smoke = args.smoke
    args.peers = args.peers or (3 if smoke else 6)
    args.preset = args.preset or "tiny"
    if args.hf_config is not None:
        path = Path(args.hf_config)
        if not (path / "config.json" if path.is_dir() else path).is_file():
            p.error(f"--hf-config {args.hf_config}: no config.json there")
        args.preset = str(path.resolve())
    elif args.preset in HF_PRESETS:
        args.preset = str(HF_PRESETS[args.preset])
    args.every = args.every or (5 if smoke else 10)
    args.overlap = args.every // 2 if args.overlap is None else args.overlap
    args.timeout = args.timeout or (100.0 if smoke else 420.0)
    args.cap = args.cap or (2.0 if smoke else 4.0)
    if args.cap < 1:
        p.error("--cap must be >= 1 (a multiple of the budget)")
    if args.budget_tokens is None:
        args.budget_tokens = 3 * 16 * 32 * 15 if smoke else 6 * 16 * 32 * 300
    if args.peers < 2:
        p.error("--peers must be >= 2")
    if args.regime is not None and args.scale != 1.0:
        p.error("--regime sets every link from the calibration; leave --scale at 1")
    return args


def load_scenario(path: str | None) -> tuple[dict[str, Any], dict[str, float], dict[str, float]]:
    """The scenario, each region's peer price (USD/h) and egress price (USD/GB)."""
    from geotrain.cli.demo import DEMO_SCENARIO, PRICES

    scenario = json.loads(Path(path).read_text()) if path else DEMO_SCENARIO
    regions = list(scenario["regions"])
    by_region: dict[str, list[float]] = {}
    for peer in scenario.get("peers", []):
        if "usd_per_hour" in peer:
            by_region.setdefault(peer["region"], []).append(float(peer["usd_per_hour"]))
    prices = {r: (sum(by_region[r]) / len(by_region[r]) if r in by_region else PRICES.get(r, 1.0)) for r in regions}
    egress = {r: float((scenario["regions"][r] or {}).get("egress_usd_per_gb", 0.02))
              if isinstance(scenario["regions"], dict) else 0.02 for r in regions}
    return scenario, prices, egress


def model_section(preset: str) -> dict[str, Any]:
    """The job's ``[model]``: a GPT preset by name, or a Hugging Face config (a path) on the byte tokenizer's
    256 tokens, at the tiny GPT's 32 tokens per sample so that tokens per step match across models."""
    if preset in GPT_PRESETS:
        return {"preset": preset}
    return {"hf_config": preset, "seq_len": HF_SEQ_LEN, "vocab_size": BYTE_VOCAB}


def job_dict(args: argparse.Namespace, work: Path, regions: int) -> dict[str, Any]:
    """The job every contender trains (contenders 1-3 read model, data, optimizer and batch size from it).

    geotrain gets an explicit pipeline count and stop step so that it trains exactly
    the budget: a stop by tokens makes the coordinator publish a new plan version,
    and peers restart from that plan's start step (see the report's caveats).
    """
    stages = args.stages or (2 if args.peers % 2 == 0 and args.peers >= 2 * regions else 1)
    pipelines = args.peers // stages
    from geotrain.config import ModelSection

    model = model_section(args.preset)
    batch, seq_len = 4 * 4, ModelSection(**model).context
    steps = max(1, args.budget_tokens // (pipelines * batch * seq_len))
    return {
        "job": {"name": "e2e", "seed": 0},
        "model": model,
        "data": {"source": "stdlib", "max_bytes": 2 << 20},
        # the other contenders take each step's 16 sequences in one pass: so do geotrain's one-stage pipelines
        "pipeline": {"stages": stages, "pipelines": pipelines, "micro_batch_size": 4, "microbatches": 4,
                     "schedule": "1f1b", "merge_microbatches": True},
        "optimizer": {"lr": 3e-3},
        "sync": {"every": args.every, "codec": args.codec, "fragments": args.fragments, "overlap": args.overlap,
                 **({} if getattr(args, "outer_lr", None) is None else {"outer_lr": args.outer_lr})},
        "codecs": {"activation": "fp16", "activation_grad": "fp16"},
        "stop": {"steps": steps},
        "checkpoint": {"dir": str(work / "geotrain" / "ckpt"), "every_rounds": 1},
        "swarm": {"min_peers": args.peers, "wait_peers_s": 180.0, "hop_timeout_s": 30.0, "round_timeout_s": 30.0},
        "report": {"dir": str(work / "geotrain"), "eval_batches": 4 if args.smoke else 8},
    }


def make_network(mode: str, scenario: dict[str, Any], scale: float, delay: str = "auto") -> Any:
    from benchmarks.contenders.launch import LoopbackNetwork, NetnsNetwork

    if mode == "off" or (mode == "auto" and os.geteuid() != 0):
        if delay == "kernel":
            raise SystemExit("--delay kernel needs network namespaces (root, --netns auto|on)")
        return LoopbackNetwork()
    tun = os.path.exists("/dev/net/tun")
    if delay == "kernel" and not tun:
        raise SystemExit("--delay kernel needs /dev/net/tun (the tun module) for the delay layer")
    return NetnsNetwork(scenario, scale=scale, delay=delay == "kernel" or (delay == "auto" and tun))


def delay_notes(network: Any) -> list[str]:
    """What the config line says about delay and bandwidth for this network."""
    if network.kernel_delayed:
        return ["every packet between regions is held for the link's one-way delay by the delay layer in the "
                "router namespace and shaped by htb: every contender pays the same delay and bandwidth; "
                "geotrain's transport adds no delay of its own"]
    notes = ["netem is absent from this kernel and the delay layer is off: the scenario's delay is added only in "
             "geotrain's transport; gloo and hivemind traffic gets no added delay"
             + (" (bandwidth is shaped by htb for all)" if network.kernel_shaped else "")]
    if not network.kernel_shaped:
        notes.append("no namespaces: contenders 1-3 run on unshaped loopback; geotrain emulates delay + bandwidth "
                     "in its transport; bytes are self-counted")
    return notes


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    args = parse(argv)
    from benchmarks.contenders.geotrain_run import run_geotrain
    from benchmarks.contenders.results import evaluate_checkpoints, ratio, time_to_target, usd
    from benchmarks.contenders.workers import run_workers
    from geotrain.config import job_from_dict
    from geotrain.coordinator.evaluate import validation_loss

    scenario, prices, egress = load_scenario(args.scenario)
    regions_all = list(scenario["regions"])
    regions = [regions_all[i % len(regions_all)] for i in range(args.peers)]
    own_dir = args.work_dir is None
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="geotrain-e2e-"))
    work.mkdir(parents=True, exist_ok=True)
    job = job_dict(args, work, len(regions_all))
    spec_job = job_from_dict(job)
    seq_len = spec_job.model.context
    batch = job["pipeline"]["micro_batch_size"] * job["pipeline"]["microbatches"]
    steps = args.budget_tokens // (args.peers * batch * seq_len)
    if steps < 1:
        raise SystemExit(f"--budget-tokens {args.budget_tokens} is less than one step of {args.peers} peers "
                         f"x {batch} x {seq_len} tokens; raise it")
    if args.regime is not None:
        scenario = _regime_scenario(args, job, scenario, work)
    scenario_path = work / "scenario.json"
    scenario_path.write_text(json.dumps(scenario))
    network = make_network(args.netns, scenario, args.scale, args.delay)
    shaped, delayed = network.kernel_shaped, network.kernel_delayed
    notes = delay_notes(network)
    init_loss = validation_loss(spec_job)
    _say({"event": "config", "peers": args.peers, "regions": regions, "preset": args.preset,
          "budget_tokens": args.budget_tokens, "steps_per_peer": steps, "batch_per_peer": batch, "seq_len": seq_len,
          "every": args.every, "overlap": args.overlap, "network": "netns" if shaped else "loopback", "bytes_method": network.bytes_method,
          "delay_method": network.delay_method if delayed else "geotrain transport only (LinkEmulator)",
          "scale": args.scale, "regime": args.regime, "cap": args.cap,
          "cap_tokens": int(args.cap * args.budget_tokens), "init_val_loss": init_loss, "notes": notes, "work_dir": str(work)})
    lines: dict[str, dict[str, Any]] = {}
    curves: dict[str, list[dict[str, Any]]] = {}
    cache: dict[str, float] = {}  # validation loss by checkpoint, shared by the watch and the curves
    links = _links(scenario)
    params = _param_count(spec_job)
    try:
        for name in args.contenders:
            cdir = work / name
            cdir.mkdir(parents=True, exist_ok=True)
            t_start = time.monotonic()
            # the loss to train to past the budget: DP's (and, for geotrain, flat DiLoCo's best if lower)
            goal = None if name == "ddp" else _goal(name, lines, curves)
            reached = None if goal is None else _watch(spec_job, goal, cache)
            try:
                if name == "geotrain":
                    line, curve = _geotrain(run_geotrain, evaluate_checkpoints, job, spec_job, args, network,
                                            regions, prices, scenario_path, cdir, init_loss, reached, cache)
                else:
                    spec = _worker_spec(name, args, job, steps, batch, regions, cdir, links, params,
                                        extend=reached is not None)
                    run = run_workers(name, spec, network=network, regions=regions, work_dir=cdir,
                                      timeout_s=spec.timeout_s + 60.0, reached=reached)
                    curve = evaluate_checkpoints(spec_job, run.snapshots, init_loss, cache=cache)
                    line = _worker_line(name, run, curve, args.budget_tokens)
                    line["timeouts"] = {"matchmaking_s": spec.matchmaking_s,
                                        "averaging_timeout_s": spec.averaging_timeout_s}
            except (TimeoutError, RuntimeError, OSError) as e:
                line, curve = {"error": f"{type(e).__name__}: {e}"[:800]}, []
            why = _failed(line, curve)
            line.update({"failed": why is not None, "why": why} if why else {"failed": False})
            line["goal_loss"] = goal
            network.check()  # a dead delay layer cuts the regions off: that is no contender's failure
            line.update(_money(line, regions, prices, egress, usd))
            line = {"event": "contender", "name": name, "label": LABELS[name], **line,
                    "bandwidth_shaped": shaped or name == "geotrain", "delay_emulated": delayed or name == "geotrain",
                    "run_s": time.monotonic() - t_start}
            lines[name], curves[name] = line, curve
        target = _target(lines)
        for name, line in lines.items():
            line["target_loss"] = target
            line["time_to_target_s"] = time_to_target(curves[name], target)
            line["reached_target"] = line["time_to_target_s"] is not None
            _say(line)
        _say(_summary(lines, target, ratio, curves, time_to_target))
    finally:
        network.close()
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if all("error" not in v for v in lines.values()) else 1


BENCH_DP_BYTES_PER_PARAM = 4  # contender 1 all-reduces fp32 gradients


def _regime_scenario(args: argparse.Namespace, job: dict[str, Any], scenario: dict[str, Any],
                     work: Path) -> dict[str, Any]:
    """Calibrate, map the regime onto this machine, print the mapping (the first JSON line), return the new scenario."""
    from benchmarks.contenders.calibrate import run_calibration
    from benchmarks.contenders.common import WorkerSpec
    from geotrain.emulate.regime import load_regime, map_regime

    try:
        regime = load_regime(args.regime)
    except ValueError as e:
        raise SystemExit(f"--regime: {e}") from None
    spec = WorkerSpec(contender="calibrate", job=job, world=args.peers, steps=3 if args.smoke else 6,
                      out_dir=str(work / "calibrate"), timeout_s=args.timeout)
    cal = run_calibration(spec, work_dir=work / "calibrate", timeout_s=args.timeout)
    regions_all = list(scenario["regions"])
    per_region = max(sum(1 for i in range(args.peers) if regions_all[i % len(regions_all)] == r) for r in regions_all)
    mapping = map_regime(regime, peers=args.peers, bench_params=cal.params,
                         bench_dp_bytes_per_param=BENCH_DP_BYTES_PER_PARAM, step_s=cal.step_s,
                         peers_per_region=per_region)
    args.mapping = mapping
    _say({"event": "regime", **mapping.describe(),
          "calibration": {"steps": cal.steps, "workers": args.peers, "per_worker_step_s": list(cal.per_worker_s),
                          "what": "forward + backward + AdamW of the benchmark's model and batch, all peers at once"},
          "lan_note": "peers of one region share its namespace: the LAN figures go to the planner's scenario, "
                      "the kernel does not shape them"})
    return mapping.scenario(scenario)


def _links(scenario: dict[str, Any]) -> dict[str, float]:
    """The slowest emulated link between regions: ``min_bandwidth_bps`` (bytes/s) and ``max_rtt_s``."""
    from geotrain.emulate import topology_from_dict

    topo = topology_from_dict(scenario)
    cross = [ln for (a, b), ln in topo.links.items() if a != b]
    if not cross:
        return {"min_bandwidth_bps": float("inf"), "max_rtt_s": 0.0}
    return {"min_bandwidth_bps": min(ln.bandwidth_bps for ln in cross), "max_rtt_s": max(ln.rtt_s for ln in cross)}


def _param_count(spec_job: Any) -> int:
    from geotrain.models import build_stage

    block_model = spec_job.model.block_model(spec_job.job.seed)
    model = build_stage(block_model, (0, block_model.num_blocks), spec_job.job.seed)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def hivemind_timeouts(*, smoke: bool, params: int, peers: int, links: dict[str, float]) -> tuple[float, float]:
    """``(matchmaking_s, averaging_timeout_s)`` for hivemind's contenders, scaled with the emulated links.

    Matchmaking needs a few DHT round trips (each a few hops): at least 10 RTTs of
    the slowest link. An fp16 all-reduce moves ~2 (n - 1) / n of the vector in and
    out of every peer: the timeout allows 4x that over the slowest link, plus
    20 RTTs; never below the defaults that work on fast links.
    """
    base_mm, base_avg = (1.5, 10.0) if smoke else (2.0, 20.0)
    rtt, bw = links["max_rtt_s"], links["min_bandwidth_bps"]
    allreduce_s = 2 * (peers - 1) / peers * params * 2 / bw if bw != float("inf") else 0.0
    return max(base_mm, 10 * rtt), max(base_avg, 4 * allreduce_s + 20 * rtt)


def _worker_spec(name: str, args: argparse.Namespace, job: dict[str, Any], steps: int, batch: int,
                 regions: list[str], cdir: Path, links: dict[str, float], params: int, *, extend: bool) -> Any:
    from benchmarks.contenders.common import WorkerSpec

    # hivemind: local steps per peer per global step (its large batch); an epoch must last well beyond
    # matchmaking or peers miss each other's groups, so ~6 epochs per run (3 in smoke mode)
    per_epoch = max(4, steps // (3 if args.smoke else 6))
    epochs = max(1, steps // per_epoch)
    cap = args.cap if extend else 1.0
    matchmaking_s, averaging_s = hivemind_timeouts(smoke=args.smoke, params=params, peers=args.peers, links=links)
    return WorkerSpec(
        contender=name, job=job, world=args.peers, steps=steps, out_dir=str(cdir / "snapshots"),
        snapshot_every=max(1, steps // (5 if args.smoke else 10)), timeout_s=args.timeout * cap, every=args.every,
        target_batch_size=args.peers * batch * per_epoch, epochs=epochs,
        matchmaking_s=matchmaking_s, averaging_timeout_s=averaging_s, run_id=f"e2e{os.getpid()}",
        regions={str(i): r for i, r in enumerate(regions)},
        max_steps=int(steps * cap), max_epochs=int(epochs * cap),
    )


def _goal(name: str, lines: dict[str, dict[str, Any]], curves: dict[str, list[dict[str, Any]]]) -> float | None:
    """The loss ``name`` trains to past the budget: DP's final loss; for geotrain also flat DiLoCo's best."""
    goals = [lines["ddp"].get("val_loss_final")] if "ddp" in lines else []
    if name == "geotrain" and curves.get("diloco"):
        goals.append(min(r["loss"] for r in curves["diloco"]))
    goals = [g for g in goals if g is not None]
    return min(goals) if goals else None


def _watch(spec_job: Any, goal: float, cache: dict[str, float]) -> Any:
    """A ``reached(checkpoint)`` callback: evaluates the checkpoint (cached) and says whether it is at ``goal``."""
    from benchmarks.contenders.results import checkpoint_loss

    def reached(c: dict[str, Any]) -> bool:
        return checkpoint_loss(spec_job, c, cache) <= goal

    return reached


def _at_budget(curve: list[dict[str, Any]], budget_tokens: int) -> dict[str, Any] | None:
    """The last curve point at or below the budget's tokens (the fixed-budget model)."""
    within = [r for r in curve if r["tokens"] <= budget_tokens]
    return within[-1] if within else None


def _failed(line: dict[str, Any], curve: list[dict[str, Any]]) -> str | None:
    """Why a contender failed (an error, or no global model after the seed), or None."""
    if "error" in line:
        return str(line["error"])
    if len(curve) <= 1:
        return "no checkpoint of the global model after the seed (no round or epoch completed)"
    extra = line.get("extra") or {}
    if extra.get("rounds_committed") == 0:
        return f"no round committed ({extra.get('rounds_discarded')} discarded)"
    return None


def _worker_line(name: str, run: Any, curve: list[dict[str, Any]], budget_tokens: int) -> dict[str, Any]:
    dones = run.dones
    cross_self = [d.get("self_bytes_cross") for d in dones]
    total_self = [d.get("self_bytes_total") for d in dones]
    kb = run.kernel_budget_bytes or run.kernel_bytes
    at = _at_budget(curve, budget_tokens)
    return {
        "wall_s": run.budget_s if run.budget_s is not None else run.wall_s,
        "tokens": at["tokens"] if at else 0,
        "val_loss_final": at["loss"] if at else None,
        "cross_region_bytes": kb["cross_total"] if kb else _sum(cross_self),
        "total_bytes": kb["total"] if kb else _sum(total_self),
        "bytes_by_region_pair": kb["cross"] if kb else None,
        "bytes_method": "kernel" if kb else dones[0].get("self_bytes_method"),
        "self_counted": {"cross_region_bytes": _sum(cross_self), "total_bytes": _sum(total_self),
                         "method": dones[0].get("self_bytes_method")},
        "setup_cross_region_bytes": run.kernel_setup_bytes["cross_total"] if run.kernel_setup_bytes else None,
        "compute_utilisation": sum(_budget_util(d) for d in dones) / len(dones),
        "checkpoints": len(curve) - 1,
        "curve": [[r["t_s"], r["tokens"], r["loss"]] for r in curve],
        "extended": _extended(run.wall_s, curve, run.kernel_bytes, run.stopped),
        "extra": {k: dones[0][k] for k in ("epochs", "rounds_committed", "rounds_discarded", "timed_out")
                  if k in dones[0]},
    }


def _budget_util(done: dict[str, Any]) -> float:
    """A worker's forward/backward share of its training time up to the budget (the whole run without one)."""
    b, c = done.get("budget_s"), done.get("compute_budget_s")
    return c / b if b and c is not None else float(done["utilisation"])


def _extended(trained_s: float, curve: list[dict[str, Any]], kb: dict[str, Any] | None, stopped: str | None
              ) -> dict[str, Any]:
    """The whole run, past the budget: how long, how far, the best loss, bytes, and why it stopped."""
    return {"trained_s": trained_s, "tokens": curve[-1]["tokens"] if curve else 0,
            "val_loss_best": min(r["loss"] for r in curve) if curve else None,
            "cross_region_bytes": kb["cross_total"] if kb else None, "stopped": stopped}


def _geotrain(run_geotrain: Any, evaluate_checkpoints: Any, job: dict[str, Any], spec_job: Any,
              args: argparse.Namespace, network: Any, regions: list[str], prices: dict[str, float],
              scenario_path: Path, cdir: Path, init_loss: float, reached: Any,
              cache: dict[str, float]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    budget_steps = int(job["stop"]["steps"])
    cap = args.cap if reached is not None else 1.0
    job = {**job, "stop": {**job["stop"], "steps": int(budget_steps * cap)}}
    run = run_geotrain(job, network=network, regions=regions, prices=prices, scenario_path=scenario_path,
                       work_dir=cdir, timeout_s=args.timeout * cap, job_id=f"e2e-{os.getpid()}",
                       budget_steps=budget_steps, reached=reached)
    rep = run.report
    s = rep["summary"]
    curve = evaluate_checkpoints(spec_job, run.checkpoints, init_loss, cache=cache)
    final = next((v for v in reversed(rep.get("validation", [])) if v.get("source") != "init"), None)
    if not run.checkpoints and final is not None and final.get("loss") is not None:
        # no checkpoints to evaluate: the coordinator's final evaluation is the only point after the seed
        curve.append({"t_s": run.wall_s, "tokens": s["tokens"], "loss": final["loss"]})
    at = _at_budget(curve, args.budget_tokens)
    pairs = rep["bytes"]["by_region_pair"]
    self_cross = sum(v for k, v in pairs.items() if k.split("->")[0] != k.split("->")[1]
                     and k.split("->")[1] != "coordinator")
    kb = run.kernel_budget_bytes or run.kernel_bytes
    util = rep.get("utilisation") or {}
    stats = rep.get("peer_stats") or {}
    # forward/backward over the training wall time, the run's clock as for every contender (from when all
    # peers can train); the report's own figure divides by the time in the plan, setup included
    train_util = [float(v["compute_s"]) / run.wall_s for v in stats.values()
                  if isinstance(v.get("compute_s"), (int, float)) and run.wall_s > 0]
    plan = (rep.get("plans") or [{}])[-1]
    return {
        "wall_s": run.budget_s if run.budget_s is not None else run.wall_s,
        "tokens": at["tokens"] if at else s["tokens"],
        "val_loss_final": at["loss"] if at and at["tokens"] > 0 else s.get("val_loss_final"),
        "val_loss_final_coordinator": s.get("val_loss_final"),
        "cross_region_bytes": kb["cross_total"] if kb else self_cross,
        "total_bytes": kb["total"] if kb else s["total_bytes"],
        "bytes_by_region_pair": kb["cross"] if kb else pairs,
        "bytes_method": "kernel" if kb else "geotrain transport counters",
        "self_counted": {"cross_region_bytes": self_cross, "total_bytes": s["total_bytes"],
                         "method": "geotrain transport counters (data plane, to peers)"},
        "setup_cross_region_bytes": run.kernel_setup_bytes["cross_total"] if run.kernel_setup_bytes else None,
        "compute_utilisation": min(1.0, sum(train_util) / len(train_util)) if train_util else None,
        "compute_utilisation_in_plan": sum(util.values()) / len(util) if util else None,
        "setup_s": run.setup_s,
        "checkpoints": len(run.checkpoints),
        "checkpoint_note": run.checkpoint_note,
        "curve": [[r["t_s"], r["tokens"], r["loss"]] for r in curve],
        "extended": _extended(run.wall_s, curve, run.kernel_bytes, run.stopped),
        "utilisation_note": "compute time over the training wall time, the whole run (compute_utilisation_in_plan: "
                            "over the time in the plan, setup included, as geotrain's report gives it)",
        "setup_note": "setup_s: the coordinator's plan to every peer's worker built (model, data, state); the clock "
                      "starts after it, as the other contenders' start after their model and process group are set up",
        "time_breakdown": time_breakdown(stats),
        "extra": {"pipelines": len(plan.get("pipelines") or []),
                  "stages": [len(p) for p in plan.get("pipelines") or []],
                  "plan_versions": s.get("plan_versions"), "report_wall_s": s.get("wall_s")},
    }, curve


def time_breakdown(peer_stats: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Where a geotrain peer's training time went, the mean over peers (seconds, whole run).

    ``compute_s``: forward/backward; ``sync_wait_s``: waiting for rounds; ``checkpoint_s``:
    writing checkpoints; ``other_s``: the rest of the peer's training wall time
    (pipeline bubbles, per-message CPU, control plane, waiting for a core).
    """
    if not peer_stats:
        return None
    keys = ("wall_s", "compute_s", "sync_wait_s", "checkpoint_s", "round_s", "cpu_s", "in_plan_s")
    mean = {}
    for k in keys:
        vals = [float(v[k]) for v in peer_stats.values() if isinstance(v.get(k), (int, float))]
        mean[k] = sum(vals) / len(vals) if vals else None
    parts = [mean[k] for k in ("wall_s", "compute_s", "sync_wait_s", "checkpoint_s")]
    other = None if any(x is None for x in parts) else parts[0] - parts[1] - parts[2] - parts[3]
    return {**mean, "other_s": other}


def _money(line: dict[str, Any], regions: list[str], prices: dict[str, float], egress: dict[str, float],
           usd: Any) -> dict[str, Any]:
    if line.get("wall_s") is None:
        return {}
    return {"usd": usd(wall_s=line["wall_s"], peer_regions=regions, prices=prices,
                       cross_pairs=line.get("bytes_by_region_pair"), egress=egress)}


def _target(lines: dict[str, dict[str, Any]]) -> float | None:
    """Contender 1's loss at the budget; without it, the first contender that has a final loss."""
    for name in ("ddp", *ALL):
        v = lines.get(name, {}).get("val_loss_final")
        if v is not None:
            return float(v)
    return None


def _sum(xs: list[Any]) -> float | None:
    return None if any(x is None for x in xs) else float(sum(xs))


def _summary(lines: dict[str, dict[str, Any]], target: float | None, ratio: Any,
             curves: dict[str, list[dict[str, Any]]], time_to_target: Any) -> dict[str, Any]:
    geo = lines.get("geotrain", {})
    out: dict[str, Any] = {"event": "summary", "target_loss": target, "target_from": "ddp" if "ddp" in lines else None}
    for name in ("ddp", "hivemind", "diloco"):
        if name not in lines:
            continue
        other = lines[name]
        t_other, t_geo = other.get("time_to_target_s"), geo.get("time_to_target_s")
        extra: dict[str, Any] = {}
        if name == "diloco" and curves.get("diloco"):
            # against flat DiLoCo: time to the best loss it reaches at all (budget or past it)
            best = min(r["loss"] for r in curves["diloco"])
            t_other, t_geo = time_to_target(curves["diloco"], best), time_to_target(curves.get("geotrain", []), best)
            extra = {"target_loss": best, "target_from": "diloco best", "diloco_time_to_best_s": t_other,
                     "geotrain_time_to_it_s": t_geo}
        setup = geo.get("setup_s")
        out[f"vs_{name}"] = {
            "speedup_to_target": ratio(t_other, t_geo),
            # the same with geotrain's plan-to-training setup on its clock (the other contender's setup is not)
            "speedup_to_target_with_setup": ratio(t_other, None if t_geo is None or setup is None else t_geo + setup),
            **extra,
            "wall_ratio": ratio(other.get("wall_s"), geo.get("wall_s")),
            "cross_region_bytes_ratio": ratio(other.get("cross_region_bytes"), geo.get("cross_region_bytes")),
            "self_counted_cross_bytes_ratio": ratio((other.get("self_counted") or {}).get("cross_region_bytes"),
                                                    (geo.get("self_counted") or {}).get("cross_region_bytes")),
            "usd_ratio": ratio((other.get("usd") or {}).get("total"), (geo.get("usd") or {}).get("total")),
            "final_loss_delta": None if other.get("val_loss_final") is None or geo.get("val_loss_final") is None
            else geo["val_loss_final"] - other["val_loss_final"],
        }
    util = geo.get("compute_utilisation")
    checks = {
        "speedup_vs_ddp>=10": _meets((out.get("vs_ddp") or {}).get("speedup_to_target"), TARGETS["speedup_vs_ddp"]),
        "speedup_vs_diloco>=1.5": _meets((out.get("vs_diloco") or {}).get("speedup_to_target"),
                                         TARGETS["speedup_vs_diloco"]),
        "cross_region_bytes_vs_ddp>=1000x": _meets((out.get("vs_ddp") or {}).get("cross_region_bytes_ratio"),
                                                  TARGETS["cross_region_bytes_ratio_vs_ddp"]),
        "compute_utilisation>=0.95": _meets(util, TARGETS["compute_utilisation"]),
    }
    out["geotrain_compute_utilisation"] = util
    out["targets_met"] = checks
    return out


def _meets(value: float | None, bar: float) -> bool | None:
    return None if value is None else value >= bar


if __name__ == "__main__":
    raise SystemExit(main())
