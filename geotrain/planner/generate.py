"""Seeded random scenarios, for testing the planner on swarms it was not tuned on.

A *generated scenario* is a plain dict for :meth:`Scenario.from_dict`, drawn
from one seed: a number of cities (AWS regions, with the measured
inter-region links of DT-FM, or relayed estimates for pairs it did not
measure; see :mod:`geotrain.planner.catalog`), an uneven number of peers per
city, a device mix (H100, A100, RTX 4090, T4, V100, each with its memory and
a list price), a GPT-style model, a fixed or free shape, a round every step
or every ``H`` steps, and codecs or none. The same seed gives the same dict.

>>> d = random_scenario(7)                 # doctest: +SKIP
>>> Scenario.from_dict(d)                  # doctest: +SKIP
"""

from __future__ import annotations

import random
from typing import Any

from geotrain.planner.catalog import AWS_LINKS, GPT3_XL, _links, _regions

# (name, sustained training TFLOP/s, memory GB, USD/hour): sustained rates, about a third of the peak
DEVICES: dict[str, tuple[float, float, float]] = {
    "h100": (300.0, 80.0, 4.0),
    "a100": (110.0, 80.0, 2.5),
    "4090": (55.0, 24.0, 0.45),
    "t4": (20.0, 16.0, 0.35),
    "v100": (40.0, 16.0, 0.92),
}
CITIES = sorted({c for pair in AWS_LINKS for c in pair})
MIXES: tuple[tuple[str, ...], ...] = (("v100",), ("a100",), ("a100", "4090"), ("h100", "a100", "4090", "t4"),
                                      ("4090", "t4"), ("h100", "4090"), ("a100", "v100", "t4"))


def _uneven(rng: random.Random, n: int, k: int) -> list[int]:
    """``n`` items over ``k`` bins, at least one each, with exponential weights (a few big cities)."""
    weights = [rng.expovariate(1.0) for _ in range(k)]
    counts = [1] * k
    for _ in range(n - k):
        x = rng.random() * sum(weights)
        for i, w in enumerate(weights):
            x -= w
            if x <= 0:
                counts[i] += 1
                break
        else:
            counts[-1] += 1
    return counts


def _peers(rng: random.Random, cities: list[str], counts: list[int], mix: tuple[str, ...]) -> list[dict[str, Any]]:
    peers = []
    for city, count in zip(cities, counts, strict=True):
        for i in range(count):
            kind = rng.choice(mix)
            tflops, mem, usd = DEVICES[kind]
            peers.append({"id": f"{city[:3]}-{kind}-{i:02d}", "region": city, "tflops": tflops, "memory_gb": mem,
                          "usd_per_hour": usd})
    return peers


def random_scenario(seed: int, *, min_peers: int = 4, max_peers: int = 40) -> dict[str, Any]:
    """One scenario drawn from ``seed`` (see the module docstring)."""
    rng = random.Random(seed)
    n = rng.randint(min_peers, max_peers)
    k = rng.randint(1, min(len(CITIES), max(1, n // 2)))
    cities = rng.sample(CITIES, k)
    counts = _uneven(rng, n, k)
    peers = _peers(rng, cities, counts, rng.choice(MIXES))
    layers = rng.choice([8, 12, 16, 24, 32])
    hidden = rng.choice([1024, 1536, 2048, 2560])
    model = {"layers": layers, "hidden": hidden, "seq_len": rng.choice([512, 1024, 2048]), "vocab": 50257,
             "dtype_bytes": 2}
    codecs = rng.random() < 0.5
    job: dict[str, Any] = {"micro_batch": 1, "micro_batches": rng.choice([8, 16, 32]),
                           "sync_every": rng.choice([1, 1, 50, 100, 500]),
                           "activation_codec": rng.choice(["int8", "fp16"]) if codecs else "none",
                           "sync_codec": rng.choice(["int8", "int4"]) if codecs else "none",
                           "objective": rng.choice(["throughput", "throughput", "cost"])}
    if rng.random() < 0.3:
        stages = rng.randint(1, min(8, n))
        job["stages"] = stages
        if rng.random() < 0.5:
            job["pipelines"] = rng.randint(1, n // stages)
    return {"name": f"generated seed {seed}: {n} peers in {k} cities", "regions": _regions(cities),
            "links": _links(cities), "peers": peers, "model": model, "job": job}


def uneven_swarm(seed: int = 0, *, peers: int = 64, cities: int = 10, stages: int = 8, pipelines: int = 8,
                 sync_every: int = 1, codecs: bool = False) -> dict[str, Any]:
    """DT-FM-style V100s over ``cities`` AWS regions with uneven counts, a fixed shape, a round every step.

    The robustness case of issue 20 (64 peers, 10 cities, 8 x 8, no codecs): the shipped DT-FM cases
    put the same number of peers in every region, which hides how the search treats leftovers.
    """
    rng = random.Random(seed)
    names = rng.sample(CITIES, cities)
    counts = _uneven(rng, peers, cities)
    ps = _peers(rng, names, counts, ("v100",))
    job = {"micro_batch": 1, "micro_batches": 32, "sync_every": sync_every, "stages": stages, "pipelines": pipelines,
           "activation_codec": "int8" if codecs else "none", "sync_codec": "int4" if codecs else "none",
           "objective": "throughput"}
    return {"name": f"{peers} V100s over {cities} cities, uneven (seed {seed})", "regions": _regions(names),
            "links": _links(names), "peers": ps, "model": dict(GPT3_XL), "job": job}


DATASHEET_FP32_TFLOPS = {"a100": 19.5, "4090": 82.6, "h100": 67.0}  # what a new user copies from spec sheets


def new_user_swarm(*, tflops: dict[str, float] | None = None) -> dict[str, Any]:
    """16 A100-80GB in us-east (virginia), 4 RTX 4090 24 GB at home in Germany, one H100 in Singapore; 1.3B model.

    The swarm of issue 20's bug reports. The 4090s sit behind home links (modelled as the
    Frankfurt region's, no egress price) and cost nothing per hour. ``tflops`` replaces the
    sustained rates by kind (``a100``, ``4090``, ``h100``): :data:`DATASHEET_FP32_TFLOPS` is
    what a user typing spec-sheet figures gets, where a 4090 looks four times an A100.
    """
    speed = {"a100": 110.0, "4090": 55.0, "h100": 300.0, **(tflops or {})}
    names = ["virginia", "frankfurt", "singapore"]
    peers = [{"id": f"a100-{i:02d}", "region": "virginia", "tflops": speed["a100"], "memory_gb": 80.0,
              "usd_per_hour": 5.12} for i in range(16)]
    peers += [{"id": f"4090-{i}", "region": "frankfurt", "tflops": speed["4090"], "memory_gb": 24.0,
               "usd_per_hour": 0.0} for i in range(4)]
    peers.append({"id": "h100-sg", "region": "singapore", "tflops": speed["h100"], "memory_gb": 80.0,
                  "usd_per_hour": 7.0})
    regions = _regions(names)
    regions["frankfurt"] = {"egress_usd_per_gb": 0.0}
    return {"name": "16 A100 us-east + 4 RTX 4090 Germany + 1 H100 Singapore", "regions": regions,
            "links": _links(names), "peers": peers, "model": dict(GPT3_XL),
            "job": {"micro_batch": 1, "micro_batches": 32, "sync_every": 100, "activation_codec": "int8",
                    "sync_codec": "int4", "objective": "throughput"}}


def heterogeneous_mix() -> dict[str, Any]:
    """H100 / A100 / RTX 4090 / T4 across three regions, a 2.7B model whose even split does not fit the small cards.

    Issue 20's mixed-devices case: one layer split for every pipeline sizes each stage for
    the smallest card in its column, so big and small peers waste each other; per-pipeline
    splits cut each pipeline for its own peers.
    """
    names = ["virginia", "frankfurt", "tokyo"]
    kinds = {"virginia": [("h100", 2), ("a100", 4)], "frankfurt": [("4090", 8)], "tokyo": [("t4", 8), ("a100", 2)]}
    peers = []
    for region, mix in kinds.items():
        for kind, count in mix:
            tflops, mem, usd = DEVICES[kind]
            peers += [{"id": f"{region[:3]}-{kind}-{i}", "region": region, "tflops": tflops, "memory_gb": mem,
                       "usd_per_hour": usd} for i in range(count)]
    model = {"layers": 32, "hidden": 2560, "seq_len": 2048, "vocab": 50257, "dtype_bytes": 2}
    return {"name": "H100/A100/4090/T4 mix over 3 regions, 2.7B model", "regions": _regions(names),
            "links": _links(names), "peers": peers, "model": model,
            "job": {"micro_batch": 1, "micro_batches": 32, "sync_every": 100, "activation_codec": "int8",
                    "sync_codec": "int4", "objective": "throughput"}}
