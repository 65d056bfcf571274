"""``geotrain emulate up|down|status|probe``: a scenario's regions as network namespaces (root).

``up`` builds the namespaces and exits (they stay until ``down``); peers are
then started with ``ip netns exec gt-<tag>-<region> geotrain peer ...`` and
bind to their region's address. Delay is added by the transport's
LinkEmulator built from the same scenario, not by the kernel. Output is JSON
lines.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "emulate",
        help="emulate a scenario's regions as network namespaces with shaped links (root)",
        description=(
            "up: build namespaces gt-<tag>-<region> joined through a router, each region pair's bandwidth "
            "shaped with htb (scenario bandwidth / --scale). down: remove them. status: what the kernel holds. "
            "probe: up, measure TCP goodput for every linked region pair, down."
        ),
    )
    p.add_argument("action", choices=("up", "down", "status", "probe"))
    p.add_argument("--scenario", help="scenario JSON (its regions and links); required for up and probe")
    p.add_argument("--tag", default="main", help="names the emulation: namespaces are gt-<tag>-*; default main")
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="divide every bandwidth by this (10 emulates 1 Gbit/s links at 100 Mbit/s); default 1",
    )
    p.add_argument(
        "--probe-seconds", type=float, default=2.0, help="probe: about how long each pair's transfer runs; default 2"
    )
    p.set_defaults(handler=_run)


def _emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


def _run(args: argparse.Namespace) -> int:
    from geotrain.emulate import Emulation, EmulationConfig, cleanup, load_topology, status
    from geotrain.errors import ConfigError

    if args.action == "down":
        _emit({"event": "down", "tag": args.tag, "removed": cleanup(args.tag)})
        return 0
    if args.action == "status":
        _emit({"event": "status", **status(args.tag)})
        return 0
    if not args.scenario:
        raise ConfigError(f"geotrain emulate {args.action} needs --scenario FILE (a scenario JSON)")
    config = EmulationConfig(topology=load_topology(args.scenario), tag=args.tag, scale=args.scale)
    em = Emulation(config)
    if args.action == "up":
        em.setup()
        info = em.describe()
        for region in info["regions"]:
            info["regions"][region]["exec"] = " ".join(em.exec_prefix(region))
        _emit({"event": "up", **info})
        return 0
    return _probe(em, args.probe_seconds)


def _probe(em: Any, seconds: float) -> int:
    from geotrain.emulate.probe import tcp_goodput
    from geotrain.errors import ConfigError

    if not 0.1 <= seconds <= 60:
        raise ConfigError(f"--probe-seconds must be between 0.1 and 60; got {seconds}")
    regions = em.config.topology.regions
    with em:
        _emit({"event": "up", **em.describe()})
        ratios = []
        for src in regions:
            for dst in regions:
                rate = em.config.rate_bps(src, dst) if src != dst else None
                if src != dst and rate is None:
                    continue  # no link: unreachable by design
                # inside a region nothing is shaped; send a fixed 32 MiB there instead of rate x seconds
                nbytes = int(rate * seconds) if rate else 32 << 20
                got = tcp_goodput(em, src, dst, nbytes, timeout=max(30.0, 4 * seconds))
                line: dict[str, Any] = {"event": "probe", "src": src, "dst": dst, "bytes": nbytes}
                line["measured_mbps"] = round(got * 8 / 1e6, 2)
                if rate:
                    line["shaped_mbps"] = round(rate * 8 / 1e6, 2)
                    line["ratio"] = round(got / rate, 3)
                    ratios.append(got / rate)
                _emit(line)
        summary: dict[str, Any] = {"event": "summary", "pairs": len(ratios)}
        if ratios:
            summary["ratio_min"] = round(min(ratios), 3)
            summary["ratio_max"] = round(max(ratios), 3)
        _emit(summary)
    _emit({"event": "down", "tag": em.config.tag})
    return 0
