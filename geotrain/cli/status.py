"""``geotrain status``: join the swarm as a client and show its live peers and link matrix.

One row per live peer (id, region, device, TFLOP/s, memory, price, age of its
last heartbeat) and the measured link matrix (Mbit/s and RTT ms, row = source).
``--json`` prints one JSON object instead:
``{"peers": [...], "links": [{"src", "dst", "bandwidth_bps", "rtt_s", "measured_at"}]}``
where ``bandwidth_bps`` is in bytes per second.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="show the swarm's live peers and links", description=__doc__)
    p.add_argument(
        "--initial-peers", nargs="+", required=True, metavar="MADDR", help="multiaddrs of swarm members"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--swarm", default="geotrain", help="swarm name (DHT key prefix); default geotrain")
    p.add_argument(
        "--timeout", type=float, default=10.0, help="deadline of each DHT read, seconds (default 10)"
    )
    p.set_defaults(handler=_run)


def collect(swarm: Any) -> dict[str, Any]:
    """The status snapshot as JSON-able data (also used by tests and the coordinator's display)."""
    now = time.time()
    peers = []
    for _, rec in sorted(swarm.get_peers().items(), key=lambda kv: (kv[1].region, kv[0])):
        row = rec.to_wire()
        row["heartbeat_age_s"] = max(0.0, now - rec.heartbeat_at)
        peers.append(row)
    live = {p["peer_id"] for p in peers}
    links = []
    for src, row in sorted(swarm.get_links().items()):
        if src not in live:
            continue  # a dead peer's row outlives it by up to one record TTL
        for dst, m in sorted(row.links.items()):
            if dst in live:
                links.append({"src": src, "dst": dst, **m.to_wire()})
    return {"peers": peers, "links": links}


def _run(args: argparse.Namespace) -> int:
    from geotrain.swarm import Swarm, SwarmConfig

    config = SwarmConfig(
        initial_peers=tuple(args.initial_peers), client_mode=True, swarm=args.swarm, timeout_s=args.timeout
    )
    with Swarm(config) as swarm:
        snapshot = collect(swarm)
    if args.json:
        print(json.dumps(snapshot), flush=True)
    else:
        _render(snapshot)
    return 0


def _short(peer_id: str) -> str:
    return peer_id[:6] + "…" + peer_id[-6:] if len(peer_id) > 14 else peer_id


def _render(snapshot: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    peers = snapshot["peers"]
    table = Table(title=f"{len(peers)} live peer(s)")
    for col in ("peer", "region", "device", "TFLOP/s", "memory GiB", "$/hour", "heartbeat age s", "endpoint"):
        table.add_column(col, justify="right" if col[0].isupper() or col[0] in "m$h" else "left")
    for p in peers:
        table.add_row(
            _short(p["peer_id"]),
            p["region"],
            p["device"],
            f"{p['flops'] / 1e12:.3f}",
            f"{p['memory_bytes'] / 2**30:.1f}",
            f"{p['usd_per_hour']:.2f}",
            f"{p['heartbeat_age_s']:.1f}",
            p["endpoint"],
        )
    console.print(table)
    if not peers:
        return
    ids = [p["peer_id"] for p in peers]
    cells = {(lk["src"], lk["dst"]): lk for lk in snapshot["links"]}
    matrix = Table(title="links: Mbit/s / RTT ms (row = from, column = to)")
    matrix.add_column("from \\ to")
    for dst in ids:
        matrix.add_column(_short(dst), justify="right")
    for src in ids:
        row = []
        for dst in ids:
            lk = cells.get((src, dst))
            row.append(
                "-" if lk is None else f"{lk['bandwidth_bps'] * 8 / 1e6:.1f} / {lk['rtt_s'] * 1e3:.2f}"
            )
        matrix.add_row(_short(src), *row)
    console.print(matrix)
