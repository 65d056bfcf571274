"""Small scenario builders for planner tests."""

from __future__ import annotations

from typing import Any


def layer(flops: float = 1e9, params: int = 1_000_000, act: int = 1000) -> dict[str, Any]:
    return {"flops_per_token": flops, "param_bytes": params, "activation_bytes_per_token": act}


def scenario(
    peers: list[dict[str, Any]],
    links: list[dict[str, Any]],
    *,
    regions: dict[str, float] | None = None,
    profile: list[dict[str, Any]] | None = None,
    seq_len: int = 100,
    **job: Any,
) -> dict[str, Any]:
    names = regions or {p["region"]: 0.0 for p in peers}
    return {
        "regions": {r: {"egress_usd_per_gb": v} for r, v in names.items()},
        "links": links,
        "peers": peers,
        "model": {"profile": profile or [layer() for _ in range(4)], "seq_len": seq_len, "dtype_bytes": 2},
        "job": {"micro_batch": 1, "micro_batches": 4, "sync_every": 1, "activation_codec": "none",
                "sync_codec": "none", **job},
    }


def peer(pid: str, region: str, tflops: float = 1.0, memory_gb: float = 100.0, usd: float = 1.0) -> dict[str, Any]:
    return {"id": pid, "region": region, "tflops": tflops, "memory_gb": memory_gb, "usd_per_hour": usd}


def link(a: str, b: str, gbps: float, rtt_ms: float) -> dict[str, Any]:
    return {"a": a, "b": b, "bandwidth_gbps": gbps, "rtt_ms": rtt_ms}
