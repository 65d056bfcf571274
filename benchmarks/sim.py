"""Simulator benchmark: speed at scale, validation against emulated runs, and the scaling grid.

``python -m benchmarks.sim`` prints JSON lines in three parts (``--parts``):

- ``scale``: 1,000 peers over 8 regions for a simulated day at 30%/hour churn;
  wall seconds against the 120 s target.
- ``validate``: runs ``benchmarks.pipeline`` (real stage runtime, real ZMQ on
  loopback, links emulated in the transport) in a few configurations and
  compares its measured tokens/s and hop bytes with the simulator's
  event-level 1F1B (fed the compute each stage measured in the run) and with
  the planner's closed form; the target is agreement within 15%.
- ``grid``: tokens/s and USD per 1M tokens from 8 to 1,000 peers under 0%,
  10% and 30% hourly churn, for the throughput and the cost objectives
  (``docs/scaling.md``).

CI smoke: ``--parts grid --grid-peers 8 --hours 1``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
from typing import Any

from geotrain.planner import Scenario
from geotrain.planner.catalog import large_swarm
from geotrain.sim import SimConfig, simulate


def _emit(rec: dict[str, Any]) -> None:
    print(json.dumps(rec), flush=True)


def scale(args: argparse.Namespace) -> None:
    sc = Scenario.from_dict(large_swarm(args.scale_peers))
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(sc, SimConfig(hours=args.hours, churn_per_hour=0.3, seed=args.seed))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = res.summary()
    _emit({"part": "scale", "peers": args.scale_peers, "hours": args.hours, "churn_per_hour": 0.3,
           "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "target_s": 120, "ok": wall < 120,
           "goodput_tokens_per_s": round(s["goodput_tokens_per_s"]), "usd_per_mtok": s["usd_per_mtok"],
           "replans": s["replans"], "repairs": s["repairs"], "departures": s["departures"], "events": s["events"]})


VALIDATION = (  # (stages, codec, Mbit/s, RTT ms)
    (2, "none", 20.0, 40.0),
    (2, "int8", 20.0, 40.0),
    (2, "none", 100.0, 10.0),
    (3, "none", 50.0, 80.0),
)


def validate(args: argparse.Namespace) -> None:
    from benchmarks import pipeline as pipe_bench
    from geotrain.models import GPTConfig, even_split
    from geotrain.models.profile import layer_profile
    from geotrain.planner.codecs import compression_ratio
    from geotrain.sim.onef1b import PipelineTiming, simulate_step

    for stages, codec, mbit, rtt_ms in VALIDATION[: args.validate_runs]:
        argv = ["--preset", "small", "--stages", str(stages), "--codec", codec, "--bandwidth-mbit", str(mbit),
                "--rtt-ms", str(rtt_ms), "--mode", "threads", "--steps", str(args.validate_steps), "--warmup", "1",
                "--microbatches", "8"]
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            pipe_bench.main(argv)
        result = next(json.loads(x) for x in buf.getvalue().splitlines() if '"result"' in x)
        cfg = GPTConfig.preset("small")
        prof = layer_profile(cfg)
        layers = even_split(cfg.num_blocks, stages)
        M, mb = result["microbatches"], result["micro_batch"]
        per_mb = [c / M for c in result["stage_compute_s_per_step"]]  # compute each stage got in the run
        ratio = compression_ratio(codec, 4)  # the benchmark trains in fp32
        hop_bytes = [mb * cfg.seq_len * prof[b - 1].activation_bytes_per_token / ratio for _, b in layers[:-1]]
        tied = cfg.vocab_size * cfg.d_model * 4 if cfg.tie_embeddings else 0  # fp32 gradient of the shared table
        timing = PipelineTiming(fwd_s=tuple(c / 3 for c in per_mb), bwd_s=tuple(2 * c / 3 for c in per_mb),
                                hop_bytes=tuple(hop_bytes), hop_bytes_per_s=(mbit * 1e6 / 8,) * (stages - 1),
                                hop_rtt_s=(rtt_ms / 1e3,) * (stages - 1), microbatches=M, duplex=True,
                                tail_s=tied / (mbit * 1e6 / 8) + rtt_ms / 2e3 if tied else 0.0)
        sim_step = simulate_step(timing)
        tokens = M * mb * cfg.seq_len
        measured_bytes = sum(result["bytes_per_hop_per_step"].values())
        # with 2 stages the tied-gradient message rides hop 0->1 (the only hop measured both ways is forward)
        predicted_bytes = M * sum(hop_bytes) + (tied if stages == 2 else 0)
        _emit({"part": "validate", "stages": stages, "codec": codec, "bandwidth_mbit": mbit, "rtt_ms": rtt_ms,
               "measured_tokens_per_s": round(result["measured_tokens_per_s"], 1),
               "simulated_tokens_per_s": round(tokens / sim_step, 1),
               "sim_over_measured": round(tokens / sim_step / result["measured_tokens_per_s"], 4),
               "planner_in_run_tokens_per_s": round(result["predicted_in_run_tokens_per_s"], 1),
               "planner_over_measured": round(result["ratio_in_run"] ** -1, 4),
               "measured_forward_bytes_per_step": measured_bytes, "simulated_forward_bytes_per_step": predicted_bytes,
               "bytes_sim_over_measured": round(predicted_bytes / measured_bytes, 4) if measured_bytes else None,
               "bubble_fraction": result["bubble_fraction"]})


def grid(args: argparse.Namespace) -> None:
    for n in args.grid_peers:
        sc = Scenario.from_dict(large_swarm(n, seed=args.seed))
        for objective in ("throughput", "cost"):
            for churn in (0.0, 0.1, 0.3):
                t0, c0 = time.perf_counter(), time.process_time()
                res = simulate(sc, SimConfig(hours=args.hours, churn_per_hour=churn, seed=args.seed), objective=objective)
                s = res.summary()
                _emit({"part": "grid", "peers": n, "objective": objective, "churn_per_hour": churn,
                       "goodput_tokens_per_s": round(s["goodput_tokens_per_s"], 1),
                       "usd_per_mtok": None if s["usd_per_mtok"] is None else round(s["usd_per_mtok"], 5),
                       "usd_per_hour": round(s["usd"] / s["hours"], 2), "utilisation": round(s["utilisation"], 4),
                       "waste_fraction": round(s["waste_fraction"], 4), "replans": s["replans"],
                       "repairs": s["repairs"], "wall_s": round(time.perf_counter() - t0, 2),
                       "cpu_s": round(time.process_time() - c0, 2)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.sim", description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="scale,validate,grid")
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--scale-peers", type=int, default=1000)
    ap.add_argument("--grid-peers", type=int, nargs="+", default=[8, 64, 256, 1000])
    ap.add_argument("--validate-runs", type=int, default=len(VALIDATION))
    ap.add_argument("--validate-steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    parts = set(args.parts.split(","))
    if "scale" in parts:
        scale(args)
    if "validate" in parts:
        validate(args)
    if "grid" in parts:
        grid(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
