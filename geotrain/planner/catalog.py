"""Ready-made scenarios (as plain dicts for :meth:`Scenario.from_dict`): DT-FM's five, and more.

Network figures are the AWS inter-region measurements published with DT-FM
(Yuan et al., NeurIPS 2022; copied into ``/work/shared/FACTS.md``): RTT in ms
and Gbit/s per region pair, 5 ms / 2 Gbit/s inside a region. A pair missing
from that table is *estimated* as the lowest-RTT relay path through measured
pairs (RTT = sum of the RTTs, bandwidth = the narrowest hop); such
links say so in :data:`ESTIMATED`. Prices are order-of-magnitude list prices:
a V100 (16 GB) at 3.06 USD/hour on demand, 0.92 on spot; egress 0.02 USD/GB
from US/EU regions and 0.09 from Asian ones.

A GPU is one peer. Its ``tflops`` is a sustained training rate (about a third
of a V100's 125 TFLOP/s fp16 peak), not the data-sheet figure.

The model of every DT-FM case is GPT-3 XL (1.3B: 24 layers, hidden 2048,
sequence 2048), the model DT-FM trained.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

AWS_LINKS: dict[tuple[str, str], tuple[float, float]] = {  # (rtt_ms, gbps)
    ("virginia", "ohio"): (11, 1.12),
    ("oregon", "virginia"): (67, 0.79),
    ("oregon", "ohio"): (49, 1.10),
    ("virginia", "london"): (76, 1.16),
    ("virginia", "frankfurt"): (90, 1.02),
    ("ohio", "ireland"): (77, 1.14),
    ("london", "frankfurt"): (14, 1.14),
    ("london", "ireland"): (12, 1.09),
    ("oregon", "tokyo"): (96, 0.52),
    ("virginia", "tokyo"): (143, 0.52),
    ("tokyo", "seoul"): (34, 1.10),
    ("tokyo", "singapore"): (73, 1.01),
    ("oregon", "singapore"): (163, 0.34),
    ("virginia", "singapore"): (230, 0.36),
    ("sydney", "frankfurt"): (265, 0.33),
}
INTRA_REGION = (5.0, 2.0)
ASIA = {"tokyo", "seoul", "singapore", "sydney"}
V100 = {"tflops": 40.0, "memory_gb": 16.0}
V100_ON_DEMAND, V100_SPOT = 3.06, 0.92
GPT3_XL = {"layers": 24, "hidden": 2048, "seq_len": 2048, "vocab": 50257, "dtype_bytes": 2}
JOB = {"micro_batch": 1, "micro_batches": 32, "sync_every": 100, "activation_codec": "int8", "sync_codec": "int4"}
ESTIMATED: set[tuple[str, str]] = set()


def aws_link(a: str, b: str) -> tuple[float, float]:
    """(rtt_ms, gbps) between two AWS regions: measured, or estimated via the lowest-RTT relay path."""
    if a == b:
        return INTRA_REGION
    for key in ((a, b), (b, a)):
        if key in AWS_LINKS:
            return AWS_LINKS[key]
    # Dijkstra on RTT over measured pairs; the estimate's bandwidth is the path's narrowest hop
    graph: dict[str, list[tuple[str, float, float]]] = {}
    for (x, y), (rtt, gbps) in AWS_LINKS.items():
        graph.setdefault(x, []).append((y, rtt, gbps))
        graph.setdefault(y, []).append((x, rtt, gbps))
    best: dict[str, tuple[float, float]] = {a: (0.0, float("inf"))}
    todo = [(0.0, a)]
    while todo:
        todo.sort()
        dist, x = todo.pop(0)
        if x == b:
            ESTIMATED.add((a, b))
            return dist, best[x][1]
        if dist > best[x][0]:
            continue
        for y, rtt, gbps in graph.get(x, []):
            cand = (dist + rtt, min(best[x][1], gbps))
            if y not in best or cand[0] < best[y][0]:
                best[y] = cand
                todo.append((cand[0], y))
    raise KeyError(f"no measured or relayed figure for {a}-{b}")


def _regions(names: list[str]) -> dict[str, dict[str, float]]:
    return {r: {"egress_usd_per_gb": 0.09 if r in ASIA else 0.02} for r in names}


def _links(names: list[str]) -> list[dict[str, Any]]:
    out = []
    for a, b in itertools.combinations_with_replacement(names, 2):
        rtt, gbps = aws_link(a, b)
        out.append({"a": a, "b": b, "bandwidth_gbps": gbps, "rtt_ms": rtt})
    return out


def _machine_links(peer_ids: list[str], per_machine: int, gbps: float, rtt_ms: float) -> list[dict[str, Any]]:
    """Peer-pair links inside multi-GPU machines (NVLink-class), overriding the region's link."""
    out = []
    for m in range(0, len(peer_ids), per_machine):
        for a, b in itertools.combinations(peer_ids[m:m + per_machine], 2):
            out.append({"a": a, "b": b, "bandwidth_gbps": gbps, "rtt_ms": rtt_ms})
    return out


def dtfm_scenario(case: int, gpus: int = 64) -> dict[str, Any]:
    """DT-FM's scenario ``case`` (1..5) with ``gpus`` V100s (64 in the paper; fewer for smoke tests)."""
    peers: list[dict[str, Any]] = []
    links: list[dict[str, Any]]
    if case in (1, 2):
        # one data centre: 8-GPU machines on a 25 Gbit/s (on demand) or 10 Gbit/s (spot) fabric
        name = "virginia"
        price = V100_ON_DEMAND if case == 1 else V100_SPOT
        peers = [{"id": f"v{i:02d}", "region": name, **V100, "usd_per_hour": price} for i in range(gpus)]
        fabric = 25.0 if case == 1 else 10.0
        links = [{"a": name, "b": name, "bandwidth_gbps": fabric, "rtt_ms": 0.1}]
        per_machine = 8 if case == 1 else 4  # spot: smaller instances
        links += _machine_links([p["id"] for p in peers], per_machine, 800.0, 0.01)
        regions = [name]
        title = "DT-FM case 1: one data centre, on demand" if case == 1 else "DT-FM case 2: one data centre, spot"
    else:
        regions = {3: ["virginia", "ohio"], 4: ["virginia", "ohio", "oregon", "london"],
                   5: ["oregon", "virginia", "ohio", "tokyo", "seoul", "london", "frankfurt", "ireland"]}[case]
        per = max(1, gpus // len(regions))
        for r in regions:
            peers += [{"id": f"{r[:3]}{i:02d}", "region": r, **V100, "usd_per_hour": V100_ON_DEMAND} for i in range(per)]
        links = _links(regions)
        title = {3: "DT-FM case 3: two universities (Virginia, Ohio)",
                 4: "DT-FM case 4: four regions (US east/west + London)",
                 5: "DT-FM case 5: eight regions world-wide"}[case]
    return {"name": title, "regions": _regions(regions), "links": links,
            "peers": peers, "model": dict(GPT3_XL), "job": {**JOB, "objective": "throughput"}}


def heterogeneous_price(spot_per_region: int = 24, top_up: int = 8) -> dict[str, Any]:
    """Spot V100s in two regions plus a few on-demand top-up peers that are fast but 8x the price.

    The question it asks: do the top-up peers pay for themselves? They add a
    little throughput at a large price, so the cost objective should drop them.
    """
    regions = ["virginia", "ohio", "oregon"]
    peers = []
    for r in ("virginia", "ohio"):
        peers += [{"id": f"{r[:3]}-spot{i:02d}", "region": r, **V100, "usd_per_hour": V100_SPOT}
                  for i in range(spot_per_region)]
    peers += [{"id": f"ore-a100-{i}", "region": "oregon", "tflops": 100.0, "memory_gb": 80.0, "usd_per_hour": 8.0}
              for i in range(top_up)]
    return {"name": "heterogeneous prices: spot V100s + on-demand A100 top-up", "regions": _regions(regions),
            "links": _links(regions), "peers": peers, "model": dict(GPT3_XL),
            "job": {**JOB, "objective": "throughput"}}


GPU_TYPES = (  # (name, sustained tflops, memory GB, USD/hour)
    ("a100", 110.0, 80.0, 3.5),
    ("v100", 40.0, 16.0, 1.0),
    ("4090", 55.0, 24.0, 0.45),
)
WORLD8 = ["oregon", "virginia", "ohio", "tokyo", "seoul", "london", "frankfurt", "ireland"]


def large_swarm(n_peers: int = 1000, *, regions: list[str] | None = None, seed: int = 0) -> dict[str, Any]:
    """``n_peers`` mixed GPUs spread over world-wide regions, seeded."""
    names = list(regions or WORLD8)
    rng = random.Random(seed)
    peers = []
    for i in range(n_peers):
        r = names[i % len(names)]
        kind, tflops, mem, usd = GPU_TYPES[rng.randrange(len(GPU_TYPES))]
        peers.append({"id": f"{r[:3]}-{kind}-{i:04d}", "region": r, "tflops": tflops, "memory_gb": mem,
                      "usd_per_hour": usd})
    return {"name": f"{n_peers} mixed peers over {len(names)} regions", "regions": _regions(names),
            "links": _links(names), "peers": peers, "model": dict(GPT3_XL), "job": {**JOB, "objective": "throughput"}}
