"""``geotrain status``: join the swarm as a client and show its live peers and link matrix.

One row per live peer (id, region, device, TFLOP/s, memory, price, age of its
last heartbeat, reachability, endpoint) and the measured link matrix (Mbit/s and
RTT ms, row = source), then what looks wrong (a peer nobody can dial, one that
publishes only a loopback address, one with no measured link).
``--json`` prints one JSON object instead:
``{"peers": [...], "links": [{"src", "dst", "bandwidth_bps", "rtt_s", "measured_at"}], "estimated": [{"src",
"dst", "bandwidth_bps", "rtt_s"}], "problems": [...]}``: ``estimated`` are the pairs nobody measured, priced
as the planner prices them (peers probe only some pairs).
where ``bandwidth_bps`` is in bytes per second and each peer has ``reachability``:
``reachable``, ``dial-out`` (behind NAT: it dials the others), ``unreachable`` or ``unknown``.
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
        row["reachability"] = reachability_word(rec)
        peers.append(row)
    live = {p["peer_id"] for p in peers}
    links = []
    for src, row in sorted(swarm.get_links().items()):
        if src not in live:
            continue  # a dead peer's row outlives it by up to one record TTL
        for dst, m in sorted(row.links.items()):
            if dst in live:
                links.append({"src": src, "dst": dst, **m.to_wire()})
    return {"peers": peers, "links": links, "estimated": estimated_links(peers, links),
            "problems": problems(peers, links)}


def estimated_links(peers: list[dict[str, Any]], links: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pairs nobody measured (peers probe only some: geotrain.swarm.probe_targets), as the planner prices
    them: the median bandwidth and RTT of the measured pairs between the same two regions."""
    import statistics

    region = {p["peer_id"]: p["region"] for p in peers}
    measured = {(lk["src"], lk["dst"]) for lk in links}
    by_pair: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for lk in links:
        if lk["src"] in region and lk["dst"] in region:
            by_pair.setdefault(tuple(sorted((region[lk["src"]], region[lk["dst"]]))), []).append(lk)
    out = []
    for a in region:
        for b in region:
            if a == b or (a, b) in measured or (b, a) in measured:
                continue
            same = by_pair.get(tuple(sorted((region[a], region[b]))), [])
            if same:
                out.append({"src": a, "dst": b,
                            "bandwidth_bps": statistics.median(x["bandwidth_bps"] for x in same),
                            "rtt_s": statistics.median(x["rtt_s"] for x in same)})
    return out


def reachability_word(rec: Any) -> str:
    """``reachable`` / ``dial-out`` (behind NAT, dials the others) / ``unreachable`` / ``unknown``."""
    if rec.dial_back:
        return "dial-out"
    return {True: "reachable", False: "unreachable", None: "unknown"}[rec.reachable]


def problems(peers: list[dict[str, Any]], links: list[dict[str, Any]]) -> list[str]:
    """What looks wrong with the swarm, one sentence per problem, each with its likely fix."""
    from geotrain.transport.addresses import is_loopback, split_endpoint

    out = []
    linked = {lk["src"] for lk in links} | {lk["dst"] for lk in links}
    regions = {p["region"] for p in peers}
    nat = [p for p in peers if p["reachability"] == "dial-out"]
    for p in peers:
        who = f"peer {_short(p['peer_id'])} ({p['region']})"
        if p["reachability"] == "unreachable":
            out.append(f"{who} cannot be dialled and does not dial out: it is left out of plans; give it "
                       "--announce with an address others reach, open its ports, or run it with --nat")
        if p["endpoint"].startswith("tcp://") and is_loopback(split_endpoint(p["endpoint"])[0]) and len(regions) > 1:
            out.append(f"{who} publishes a loopback address ({p['endpoint']}): start it with --host 0.0.0.0 "
                       "(and --announce its public address) so other machines can reach it")
        if len(peers) > 1 and p["peer_id"] not in linked and time.time() - p["started_at"] > 120:
            out.append(f"{who} has no measured link after 2 minutes: its data-plane port is not reachable from "
                       "the others (or it cannot reach them); see its reachability line")
    if len(nat) > 1:
        out.append(f"{len(nat)} peers are behind NAT (dial-out): they exchange through a reachable relay peer "
                   "(an extra hop), and without one a plan takes only one of them")
    return out


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
    for col in ("peer", "region", "device", "TFLOP/s", "memory GiB", "$/hour", "heartbeat age s", "reachability",
                "endpoint"):
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
            p.get("reachability", "unknown"),
            p["endpoint"],
        )
    console.print(table)
    for line in snapshot.get("problems", []):
        console.print(f"[bold red]problem:[/] {line}")
    if not peers:
        return
    ids = [p["peer_id"] for p in peers]
    cells = {(lk["src"], lk["dst"]): lk for lk in snapshot["links"]}
    guessed = {(lk["src"], lk["dst"]): lk for lk in snapshot.get("estimated", [])}
    matrix = Table(title="links: Mbit/s / RTT ms (row = from, column = to; ~ = estimated from its regions' "
                         "measured pairs)")
    matrix.add_column("from \\ to")
    for dst in ids:
        matrix.add_column(_short(dst), justify="right")
    for src in ids:
        row = []
        for dst in ids:
            lk = cells.get((src, dst))
            est = guessed.get((src, dst))
            if lk is not None:
                row.append(f"{lk['bandwidth_bps'] * 8 / 1e6:.1f} / {lk['rtt_s'] * 1e3:.2f}")
            elif est is not None:
                row.append(f"~{est['bandwidth_bps'] * 8 / 1e6:.1f} / {est['rtt_s'] * 1e3:.2f}")
            else:
                row.append("-")
        matrix.add_row(_short(src), *row)
    console.print(matrix)
