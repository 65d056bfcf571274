"""``geotrain simulate``: a day (or any span) of a job on a scenario, with churn, by discrete-event simulation.

Prints a summary table, or with ``--json`` JSON lines: one ``{"event": "sample", ...}`` per timeline
sample, then ``{"event": "summary", ...}`` with totals and bytes per region pair.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("simulate", help="simulate a job on a scenario: churn, replans, tokens/s and USD over time")
    p.add_argument("scenario", metavar="SCENARIO", help="scenario JSON (see docs/scenario.md)")
    p.add_argument("--peers", type=int, default=None, help="grow/shrink the scenario to N peers (same mix)")
    p.add_argument("--churn", type=float, default=0.0, metavar="RATE", help="departures per peer per hour (0.1 = 10%%)")
    p.add_argument("--hours", type=float, default=24.0, help="simulated hours (default 24)")
    p.add_argument("--bursts", type=float, default=0.0, metavar="RATE", help="preemption bursts per hour")
    p.add_argument("--rejoin-hours", type=float, default=0.5, help="mean downtime before a peer returns (0: never)")
    p.add_argument("--objective", default=None, help="override job.objective (as in geotrain plan)")
    p.add_argument("--closed-form", action="store_true", help="time pipelines with the planner's closed form")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    p.add_argument("--plot", metavar="FILE", default=None, help="write tokens/s and USD/hour over time (PNG)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from geotrain.cli.plan import load_scenario
    from geotrain.planner import Scenario
    from geotrain.sim import SimConfig, simulate
    from geotrain.sim.scaling import scale_peers

    sc = load_scenario(args.scenario)
    if args.peers:
        with open(args.scenario, encoding="utf-8") as f:
            sc = Scenario.from_dict(scale_peers(json.load(f), args.peers))
    cfg = SimConfig(hours=args.hours, churn_per_hour=args.churn, burst_per_hour=args.bursts,
                    rejoin_hours=args.rejoin_hours, exact_pipelines=not args.closed_form, seed=args.seed)
    res = simulate(sc, cfg, objective=args.objective)
    out = res.to_json()
    if args.plot:
        _plot(out["timeline"], args.plot)
    if args.json:
        for row in out["timeline"]:
            print(json.dumps({"event": "sample", **row}))
        print(json.dumps({"event": "summary", **out["summary"], "bytes_per_region_pair": out["bytes_per_region_pair"],
                          "peers": len(sc.peers), "churn_per_hour": args.churn}))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"simulated {args.hours:g} h, {len(sc.peers)} peers, churn {args.churn:g}/h")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in out["summary"].items():
        if k == "warnings":
            continue
        t.add_row(k, f"{v:,.4g}" if isinstance(v, float) and math.isfinite(v) else str(v))
    Console().print(t)
    for w in out["summary"]["warnings"]:
        Console(stderr=True).print(f"warning: {w}")
    return 0


def _plot(timeline: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hours = [r["t_h"] for r in timeline]
    fig, (a, b) = plt.subplots(2, 1, sharex=True, figsize=(8, 5))
    a.plot(hours, [r["tokens_per_s"] for r in timeline])
    a.set_ylabel("tokens/s")
    b.plot(hours, [r["usd_per_hour"] for r in timeline], color="tab:red")
    b.set_ylabel("USD/hour")
    # absolute axes from zero: an offset axis made a 0.006 USD/hour change look like a crash
    for ax in (a, b):
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        ax.set_ylim(bottom=0)
    b.set_xlabel("hours")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
