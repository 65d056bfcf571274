"""``geotrain demo``: a whole region-spanning job on this machine, ending with a report.

Starts a bootstrap DHT node and ``--peers`` peers spread over three emulated
regions (child processes on loopback), runs a small GPT job on the embedded
corpus (the Python standard library's source, byte-level) and prints the
report's path and a summary table. Links between regions are emulated in the
transport (one-way delay and bandwidth per region pair, from the demo
scenario); inside a region they are plain loopback. Every child is stopped on
exit or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

#: Three regions, 100 Mbit/s and 40-150 ms between them (the end-to-end benchmark's default shape).
DEMO_SCENARIO: dict[str, Any] = {
    "regions": {
        "us-east": {"egress_usd_per_gb": 0.02},
        "eu-west": {"egress_usd_per_gb": 0.02},
        "ap-south": {"egress_usd_per_gb": 0.08},
    },
    "links": [
        {"a": "us-east", "b": "us-east", "bandwidth_gbps": 10.0, "rtt_ms": 1},
        {"a": "eu-west", "b": "eu-west", "bandwidth_gbps": 10.0, "rtt_ms": 1},
        {"a": "ap-south", "b": "ap-south", "bandwidth_gbps": 10.0, "rtt_ms": 1},
        {"a": "us-east", "b": "eu-west", "bandwidth_gbps": 0.1, "rtt_ms": 76},
        {"a": "us-east", "b": "ap-south", "bandwidth_gbps": 0.1, "rtt_ms": 150},
        {"a": "eu-west", "b": "ap-south", "bandwidth_gbps": 0.1, "rtt_ms": 120},
    ],
}
REGIONS = ("us-east", "eu-west", "ap-south")
PRICES = {"us-east": 2.0, "eu-west": 2.2, "ap-south": 1.4}


def demo_job(*, steps: int, peers: int, preset: str) -> dict[str, Any]:
    return {
        "job": {"name": "demo", "seed": 0},
        "model": {"preset": preset},
        "data": {"source": "stdlib", "max_bytes": 2 << 20},
        # every peer trains (the planner still places them and cuts the stages): with 6 peers sharing a few
        # cores, benchmarked compute flatters one pipeline and the planner sometimes picks it alone
        "pipeline": {"stages": 2, "pipelines": max(1, peers // 2), "micro_batch_size": 8, "microbatches": 2,
                     "schedule": "1f1b"},
        "optimizer": {"lr": 3e-3},
        "sync": {"every": 10, "codec": "int8", "fragments": 1, "overlap": 5},  # streaming: rounds hide behind steps
        "codecs": {"activation": "fp16", "activation_grad": "fp16"},
        "stop": {"steps": steps},
        "swarm": {"min_peers": peers, "wait_peers_s": 180.0, "hop_timeout_s": 30.0, "round_timeout_s": 30.0,
                  "heartbeat_s": 2.0},
        "report": {"dir": "runs", "eval_every": 20, "eval_batches": 8},
    }


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run a 3-region job on this machine and report", description=__doc__)
    p.add_argument("--peers", type=int, default=6, help="peers to start (default 6, spread over 3 regions)")
    p.add_argument("--steps", type=int, default=60, help="inner steps to train (default 60)")
    p.add_argument("--preset", default="tiny", help="model preset (default tiny; small is slower)")
    p.add_argument("--report-dir", default=None, help="where the report goes (default runs/demo-<time>)")
    p.add_argument("--json", action="store_true", help="JSON lines instead of the live view")
    p.add_argument("--no-emulation", action="store_true", help="plain loopback between regions")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from geotrain.cli.run import print_summary, run_coordinator
    from geotrain.config import job_from_dict
    from geotrain.testing.procs import ChildGroup
    from geotrain.testing.swarm import start_local_swarm

    if args.peers < 2:
        print("geotrain demo: --peers must be >= 2", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    say = (lambda e: print(json.dumps(e, default=str), flush=True)) if args.json else (lambda e: None)
    job = job_from_dict(demo_job(steps=args.steps, peers=args.peers, preset=args.preset))
    job_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    report_dir = Path(args.report_dir) if args.report_dir else Path("runs") / job_id
    with tempfile.TemporaryDirectory(prefix="geotrain-demo-") as tmp, ChildGroup() as children:
        scenario = Path(tmp) / "scenario.json"
        scenario.write_text(json.dumps(DEMO_SCENARIO))
        if not args.json:
            print(f"geotrain demo: {args.peers} peers in {len(REGIONS)} emulated regions "
                  f"({'links emulated in the transport: delay + bandwidth' if not args.no_emulation else 'no emulation'})",
                  flush=True)
        local = start_local_swarm(
            children,
            regions=[REGIONS[i % len(REGIONS)] for i in range(args.peers)],
            job_id=job_id,
            prices=PRICES,
            emulate=None if args.no_emulation else str(scenario),
            emulate_bandwidth=True,
        )
        maddrs = local.maddrs
        for info in local.ready:
            say(info)
        if args.json:
            report = run_coordinator(None, initial_peers=maddrs, job_id=job_id, report_dir=report_dir,
                                     emit=say, stop=stop, job=job)
        else:
            from geotrain.coordinator.live import LiveView

            with LiveView() as view:
                report = run_coordinator(None, initial_peers=maddrs, job_id=job_id, report_dir=report_dir,
                                         emit=view, stop=stop, job=job)
    path = report_dir / "report.json"
    if args.json:
        say({"event": "done", "report": str(path), "summary": report["summary"]})
    else:
        print_summary(report)
        print(f"report: {path}  (plots: {', '.join(sorted(p.name for p in report_dir.glob('*.png')))})")
    return 0
