"""Simulator validation: the simulator against real geotrain jobs on emulated regions (issue 10).

For a few of the end-to-end benchmark's configurations (``benchmarks.e2e``:
the demo's 3 regions, 100 Mbit/s, 76-150 ms RTT, tiny GPT), this runs the real
job (``benchmarks.contenders.geotrain_run``: ``geotrain dht``, one ``geotrain
peer`` per peer, ``geotrain run``; regions as network namespaces with htb when
root) and then the simulator (``geotrain.sim``) on the same scenario, the same
plan (the one the run trained with), model, codecs and H, and prints one JSON
line per configuration with simulated against measured tokens/s and bytes and
their ratios (``sim / measured``), then a summary.

The simulator is fed two ways, both on one line:

- ``planner``: each peer's ``tflops`` as its own benchmark measured it
  (a 512 x 512 matmul; what the planner and a user's simulation see);
- ``in_run``: each peer's effective speed in the run (its stage's FLOPs over
  the compute seconds the report's ``utilisation`` gives), which takes
  compute out of the comparison and leaves the schedule, the network and
  per-step overheads.

Then ``calibrated``: in-run plus the two overhead terms the model lacks, fitted
on the calibration runs (``CALIBRATE_ON``, the two 1-stage runs at H = 10 and
20): their unexplained time per inner step is ``a + b / H``, ``a`` =
``SimConfig.step_overhead_s`` and ``b`` = ``SimConfig.round_overhead_s``, two
equations for two unknowns (clamped to >= 0, and the calibration line says so).
The other runs are predicted out of sample. ``step_only`` is the older,
one-term calibration (the first calibration run's whole unexplained time as a
per-step overhead), kept to show what the round term changes. With one
calibration run, or runs at one H, only ``a`` can be fitted.

Measured bytes come two ways: ``data_plane`` (geotrain's transport counters:
activations, gradients, pseudo-gradients, headers; the simulator models
these) and ``kernel`` (the htb/``lo`` counters: everything, DHT control plane
included; only with namespaces). ``control_plane_bytes_per_s`` is their
difference over the run.

Run: ``python -m benchmarks.simval`` (3 configurations, ~10-15 min here) or
``--smoke`` (one tiny configuration); ``--from DIR`` re-analyses the runs kept
by an earlier ``--work-dir DIR`` without training again.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

TARGET = 0.15  # |sim / measured - 1| the issue asks for
FULL = ({"name": "2-stage", "stages": 2, "every": 10}, {"name": "1-stage", "stages": 1, "every": 10},
        {"name": "1-stage-H20", "stages": 1, "every": 20})
SMOKE = ({"name": "smoke-1-stage", "stages": 1, "every": 5},)
# the runs whose unexplained per-step time (at two H) and control-plane rate the others are predicted with
CALIBRATE_ON = ("1-stage", "1-stage-H20")
MEMORY_GB = 16.0  # the report does not carry peers' memory; the tiny model fits anywhere


def _say(rec: dict[str, Any]) -> None:
    print(json.dumps(rec, default=str), flush=True)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 4)


def run_config(cfg: dict[str, Any], args: argparse.Namespace, work: Path, network: Any) -> dict[str, Any]:
    """Train one configuration for real; returns (and keeps under ``work``) what the run measured."""
    from benchmarks import e2e
    from benchmarks.contenders.geotrain_run import run_geotrain

    argv = ["--contenders", "geotrain", "--stages", str(cfg["stages"]), "--every", str(cfg["every"]),
            "--netns", args.netns]
    if args.smoke:
        argv.append("--smoke")
    eargs = e2e.parse(argv)
    scenario, prices, _ = e2e.load_scenario(None)
    regions_all = list(scenario["regions"])
    regions = [regions_all[i % len(regions_all)] for i in range(eargs.peers)]
    cdir = work / cfg["name"]
    cdir.mkdir(parents=True, exist_ok=True)
    job = e2e.job_dict(eargs, cdir, len(regions_all))
    scenario_path = cdir / "scenario.json"
    scenario_path.write_text(json.dumps(scenario))
    run = run_geotrain(job, network=network, regions=regions, prices=prices, scenario_path=scenario_path,
                       work_dir=cdir, timeout_s=eargs.timeout, job_id=f"simval-{os.getpid()}-{cfg['name']}")
    kept = {"config": cfg, "job": job, "scenario": scenario, "scale": eargs.scale, "wall_s": run.wall_s,
            "kernel_bytes": run.kernel_bytes, "report": run.report}
    (cdir / "measured.json").write_text(json.dumps(kept, default=str))
    return kept


def measured_figures(kept: dict[str, Any]) -> dict[str, Any]:
    rep = kept["report"]
    pairs = rep["bytes"]["by_region_pair"]
    # the coordinator's final model fetch is not training traffic
    dp = {k: v for k, v in pairs.items() if k.split("->")[1] != "coordinator"}
    kb = kept["kernel_bytes"]
    tokens = rep["summary"]["tokens"]
    wall = kept["wall_s"]
    out = {
        "tokens": tokens, "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1),
        "data_plane_cross_bytes": sum(v for k, v in dp.items() if k.split("->")[0] != k.split("->")[1]),
        "data_plane_total_bytes": sum(dp.values()),
        "kernel_cross_bytes": kb["cross_total"] if kb else None,
        "kernel_total_bytes": kb["total"] if kb else None,
    }
    if kb:
        out["control_plane_bytes_per_s"] = round((kb["total"] - out["data_plane_total_bytes"]) / wall)
    return out


def sim_scenario(kept: dict[str, Any], *, in_run: bool) -> tuple[Any, list[list[Any]], int]:
    """The planner scenario of the run (its links, its peers, its model and job), its plan and its steps."""
    from geotrain.config import job_from_dict
    from geotrain.coordinator.planning import scenario_dict
    from geotrain.planner import CostModel, Scenario, StageAssignment

    spec = job_from_dict(kept["job"])
    base = scenario_dict(spec, {}, {})  # model profile and job section as the coordinator builds them
    sc = kept["scenario"]
    links = [{**ln, "bandwidth_gbps": ln["bandwidth_gbps"] / kept["scale"]} for ln in sc["links"]]
    rep = kept["report"]
    peers = [{"id": p["peer_id"], "region": p["region"], "tflops": p["tflops"], "memory_gb": MEMORY_GB,
              "usd_per_hour": p.get("usd_per_hour", 1.0)} for p in rep["peers"]]
    plan = rep["plans"][-1]["pipelines"]
    pipelines = [[StageAssignment(peer=s["peer"], layers=(int(s["layers"][0]), int(s["layers"][1]))) for s in pipe]
                 for pipe in plan]
    steps = int(kept["job"]["stop"]["steps"])
    # overlap 0 (the e2e job) means a round blocks the next inner step; the coordinator's scenario leaves
    # overlap_sync at the planner's default (True), which would hide the round
    job = {**base["job"], "overlap_sync": int(kept["job"]["sync"].get("overlap") or 0) > 0,
           "sync_intra_codec": spec.sync.intra_codec}
    d = {**base, "regions": sc["regions"], "links": links, "peers": peers, "job": job}
    if in_run:
        # a peer's effective speed in the run: its stage's FLOPs per inner step over the compute seconds
        # it spent per inner step (utilisation x time in the plan / steps)
        cm = CostModel(Scenario.from_dict(d))
        util = rep.get("utilisation") or {}
        wall_in_plan = float(rep["summary"].get("wall_s") or rep["wall_s"])
        for p in peers:
            st = next((s for pipe in pipelines for s in pipe if s.peer == p["id"]), None)
            if st is None or not util.get(p["id"]):
                continue
            model_s = cm.M * cm.stage_compute_s(st.layers[0], st.layers[1], p["tflops"] * 1e12)
            real_s = util[p["id"]] * wall_in_plan / steps
            p["tflops"] = p["tflops"] * model_s / real_s
    return Scenario.from_dict(d), pipelines, steps


def simulate_run(kept: dict[str, Any], *, in_run: bool, overhead_s: float = 0.0,
                 round_overhead_s: float = 0.0) -> dict[str, Any]:
    from geotrain.sim import SimConfig, simulate

    scenario, pipelines, steps = sim_scenario(kept, in_run=in_run)
    # no churn, no stragglers: the run had neither; long enough for many rounds
    hours = max(0.05, 20 * kept["wall_s"] / 3600.0)
    # the run waits for every pipeline (round_timeout_s 30 s): no deadline misses in the simulation either
    res = simulate(scenario, SimConfig(hours=hours, straggler_sigma=0.0, deadline_factor=1e6, seed=0,
                                       step_overhead_s=overhead_s, round_overhead_s=round_overhead_s),
                   initial_plan=pipelines)
    s = res.summary()
    tok_per_s = s["goodput_tokens_per_s"]
    job_tokens = kept["report"]["summary"]["tokens"]
    scale = job_tokens / s["tokens"] if s["tokens"] else 0.0  # the run's tokens over the simulated ones
    cross = sum(v for (a, b), v in res.bytes_per_region_pair.items() if a != b) * scale
    total = sum(res.bytes_per_region_pair.values()) * scale
    mean_tflops = sum(p.tflops for p in scenario.peers) / len(scenario.peers)
    return {"tokens_per_s": round(tok_per_s, 1), "cross_bytes": round(cross), "total_bytes": round(total),
            "mean_peer_tflops": round(mean_tflops, 5), "steps": steps}


def compare(kept: dict[str, Any], calibration: dict[str, Any] | None = None) -> dict[str, Any]:
    """Simulated against measured for one run; ``calibration`` (:func:`calibrate` of the calibration runs) adds
    the ``calibrated`` figures (the in-run simulation plus the fitted per-step and per-round overheads and the
    control-plane rate) and the ``step_only`` ones (the one-term calibration it replaces)."""
    m = measured_figures(kept)
    plan_sim = simulate_run(kept, in_run=False)
    run_sim = simulate_run(kept, in_run=True)
    steps = plan_sim["steps"]
    peers = len(kept["report"]["peers"])
    rec: dict[str, Any] = {"event": "config", **kept["config"], "pipelines": len(kept["report"]["plans"][-1]["pipelines"]),
                           "measured": m, "sim_planner": plan_sim, "sim_in_run": run_sim}
    sims = [("planner", plan_sim), ("in_run", run_sim)]
    if calibration is not None:
        cal = simulate_run(kept, in_run=True, overhead_s=calibration["step_overhead_s"],
                           round_overhead_s=calibration["round_overhead_s"])
        # DHT heartbeats, progress and plan records, polling: bytes per peer per second, counted by the kernel
        control = calibration["control_bytes_per_peer_s"] * peers * (m["tokens"] / cal["tokens_per_s"]) \
            if calibration["control_bytes_per_peer_s"] is not None and cal["tokens_per_s"] else None
        cal["kernel_total_bytes"] = None if control is None else round(cal["total_bytes"] + control)
        rec["sim_calibrated"] = {**cal, "calibrated_on": calibration["name"],
                                 "step_overhead_s": calibration["step_overhead_s"],
                                 "round_overhead_s": calibration["round_overhead_s"],
                                 "control_bytes_per_peer_s": calibration["control_bytes_per_peer_s"]}
        step_only = simulate_run(kept, in_run=True, overhead_s=calibration["step_only_overhead_s"])
        rec["sim_step_only"] = {**step_only, "step_overhead_s": calibration["step_only_overhead_s"]}
        sims += [("calibrated", cal), ("step_only", step_only)]
    rec["measured_step_s"] = round(m["wall_s"] / steps, 4)
    for key, sim in sims:
        rec[f"{key}_tokens_ratio"] = _ratio(sim["tokens_per_s"], m["tokens_per_s"])
        rec[f"{key}_step_s"] = round(m["tokens"] / steps / sim["tokens_per_s"], 4) if sim["tokens_per_s"] else None
    rec["data_plane_cross_bytes_ratio"] = _ratio(run_sim["cross_bytes"], m["data_plane_cross_bytes"])
    rec["data_plane_total_bytes_ratio"] = _ratio(run_sim["total_bytes"], m["data_plane_total_bytes"])
    rec["kernel_cross_bytes_ratio"] = _ratio(run_sim["cross_bytes"], m["kernel_cross_bytes"])
    rec["kernel_total_bytes_ratio"] = _ratio(run_sim["total_bytes"], m["kernel_total_bytes"])
    if calibration is not None:
        rec["calibrated_kernel_total_bytes_ratio"] = _ratio(rec["sim_calibrated"]["kernel_total_bytes"],
                                                            m["kernel_total_bytes"])
    # per inner step, what neither compute (as measured in the run) nor the network model explains
    rec["unexplained_step_s"] = None if rec["in_run_step_s"] is None else round(
        rec["measured_step_s"] - rec["in_run_step_s"], 4)
    return rec


def fit_overheads(points: list[tuple[int, float]]) -> tuple[float, float, list[str]]:
    """``(a, b, clamped)``: per-step and per-round overhead with unexplained time per step ``u = a + b / H``.

    ``points`` are ``(H, u)`` of the calibration runs. Two runs at different H give two equations, solved
    exactly (more are fitted by least squares). A negative term means the data contradict the model (noise
    larger than the effect); it is set to 0 and the other term refitted alone, and ``clamped`` names it, so
    the caller can say so. Runs at a single H cannot separate the terms: ``a`` is their mean, ``b`` 0.
    """
    xs = [1.0 / h for h, _ in points]
    us = [u for _, u in points]
    n = len(points)
    if not n:
        raise ValueError("fit_overheads needs at least one (H, unexplained) point")
    x_mean, u_mean = sum(xs) / n, sum(us) / n
    var = sum((x - x_mean) ** 2 for x in xs)
    if var == 0.0:
        return max(0.0, u_mean), 0.0, (["step_overhead_s"] if u_mean < 0 else [])
    b = sum((x - x_mean) * (u - u_mean) for x, u in zip(xs, us, strict=True)) / var
    a = u_mean - b * x_mean
    if b < 0:  # per-step time grows with H: no round cost to see; all of it per step
        return max(0.0, u_mean), 0.0, ["round_overhead_s"] + (["step_overhead_s"] if u_mean < 0 else [])
    if a < 0:  # all of it per round: the least-squares line through the origin
        b = max(0.0, sum(x * u for x, u in zip(xs, us, strict=True)) / sum(x * x for x in xs))
        return 0.0, b, ["step_overhead_s"] + (["round_overhead_s"] if b == 0.0 else [])
    return a, b, []


def calibrate(kept_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """What the calibration runs say the model lacks: per-step and per-round overheads (:func:`fit_overheads`)
    and the control plane's bytes per peer per second (their mean)."""
    points: list[dict[str, Any]] = []
    rates: list[float] = []
    for kept in kept_runs:
        rec = compare(kept)
        points.append({"name": kept["config"]["name"], "every": int(kept["job"]["sync"]["every"]),
                       "unexplained_step_s": rec["unexplained_step_s"]})
        ctrl = rec["measured"].get("control_plane_bytes_per_s")
        if ctrl is not None:  # only with namespaces (kernel counters)
            rates.append(ctrl / len(kept["report"]["peers"]))
    a, b, clamped = fit_overheads([(p["every"], p["unexplained_step_s"]) for p in points])
    return {"event": "calibration", "name": "+".join(p["name"] for p in points), "points": points,
            "terms": 2 if len({p["every"] for p in points}) > 1 else 1,
            "step_overhead_s": round(a, 5), "round_overhead_s": round(b, 4), "clamped": clamped,
            # the one-term calibration this replaces: the first run's whole unexplained time, per step
            "step_only_overhead_s": max(0.0, points[0]["unexplained_step_s"]),
            "control_bytes_per_peer_s": round(sum(rates) / len(rates)) if len(rates) == len(points) else None}


def _within(r: float | None) -> bool | None:
    return None if r is None else abs(r - 1.0) <= TARGET


def summary(recs: list[dict[str, Any]]) -> dict[str, Any]:
    out_of_sample = [r for r in recs if not r.get("calibrated_on_self")]
    keys = ("planner_tokens_ratio", "in_run_tokens_ratio", "calibrated_tokens_ratio", "step_only_tokens_ratio",
            "data_plane_cross_bytes_ratio",
            "data_plane_total_bytes_ratio", "kernel_cross_bytes_ratio", "kernel_total_bytes_ratio",
            "calibrated_kernel_total_bytes_ratio")
    return {"event": "summary", "configs": len(recs), "target": f"within {TARGET:.0%}",
            "within_target": {k: [_within(r.get(k)) for r in recs] for k in keys},
            "calibrated_out_of_sample_within_target": [_within(r.get("calibrated_tokens_ratio")) for r in out_of_sample]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.simval", description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="one tiny configuration (3 peers, a few hundred steps' worth less)")
    ap.add_argument("--configs", default=None, help="comma-separated names (full: 2-stage,1-stage,1-stage-H20)")
    ap.add_argument("--netns", default="auto", choices=("auto", "on", "off"), help="as benchmarks.e2e")
    ap.add_argument("--work-dir", default=None, help="keep the runs here (default: a temp dir, removed)")
    ap.add_argument("--from", dest="from_dir", default=None, help="re-analyse runs kept under DIR; train nothing")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    configs: tuple[dict[str, Any], ...] = SMOKE if args.smoke else FULL
    if args.configs:
        names = set(args.configs.split(","))
        configs = tuple(c for c in (*FULL, *SMOKE) if c["name"] in names)
    kept_runs, failed = (load_runs(args.from_dir, configs) if args.from_dir else train_runs(args, configs))
    recs = analyse(kept_runs)
    _say(summary(recs))
    return 1 if failed or not recs else 0


def load_runs(from_dir: str, configs: tuple[dict[str, Any], ...]) -> tuple[list[dict[str, Any]], int]:
    paths = [Path(from_dir) / c["name"] / "measured.json" for c in configs]
    return [json.loads(p.read_text()) for p in paths if p.exists()], 0


def train_runs(args: argparse.Namespace, configs: tuple[dict[str, Any], ...]) -> tuple[list[dict[str, Any]], int]:
    from benchmarks import e2e

    own = args.work_dir is None
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="geotrain-simval-"))
    work.mkdir(parents=True, exist_ok=True)
    scenario, _, _ = e2e.load_scenario(None)
    network = e2e.make_network(args.netns, scenario, 1.0)
    kept_runs, failed = [], 0
    try:
        for c in configs:
            try:
                kept_runs.append(run_config(c, args, work, network))
            except (TimeoutError, RuntimeError, OSError) as e:
                failed += 1
                _say({"event": "config", **c, "error": f"{type(e).__name__}: {e}"[:800]})
    finally:
        network.close()
        if own:
            shutil.rmtree(work, ignore_errors=True)
    return kept_runs, failed


def analyse(kept_runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per run; the overheads and control-plane rate come from the calibration runs (``CALIBRATE_ON``
    that ran, else the first run) and are applied to the others (out of sample) and, marked, to themselves."""
    if not kept_runs:
        return []
    cal_runs = [k for k in kept_runs if k["config"]["name"] in CALIBRATE_ON] or kept_runs[:1]
    cal = calibrate(cal_runs)
    _say(cal)
    recs = []
    for k in kept_runs:
        rec = compare(k, cal)
        rec["calibrated_on_self"] = any(k is c for c in cal_runs)
        recs.append(rec)
        _say(rec)
    return recs


if __name__ == "__main__":
    raise SystemExit(main())
