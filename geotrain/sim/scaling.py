"""Grow or shrink a scenario to N peers, keeping its mix of regions and peer kinds."""

from __future__ import annotations

import copy
from typing import Any

from geotrain.errors import ConfigError


def scale_peers(d: dict[str, Any], n: int) -> dict[str, Any]:
    """A copy of scenario dict ``d`` with ``n`` peers: its peers repeated in order (``p0``, ``p0~1``, ...).

    Peer-pair links are kept only between peers that survive; clones get their regions' links.
    """
    if n < 1:
        raise ConfigError(f"--peers must be >= 1; got {n}")
    out = copy.deepcopy(d)
    base = d["peers"]
    peers = []
    for i in range(n):
        p = dict(base[i % len(base)])
        if i >= len(base):
            p["id"] = f"{p['id']}~{i // len(base)}"
        peers.append(p)
    out["peers"] = peers
    ids = {p["id"] for p in peers}
    regions = set(d["regions"])
    out["links"] = [ln for ln in d.get("links", []) if (ln["a"] in regions and ln["b"] in regions)
                    or (ln["a"] in ids and ln["b"] in ids)]
    return out
