"""Which peers a peer probes: a few in its own region and representatives of every other region.

Why not all pairs? Probing every other peer is O(N) per peer and O(N^2) for the
swarm, in bytes (bulk transfers of up to 4 MiB each) and in time. The planner
reasons mostly by region: a region pair's figure is the median of the measured
pairs between them (``geotrain.coordinator.planning``), and an unmeasured pair
is priced by its regions' figure (an *estimated* link). So a peer measures:

- ``local`` peers of its own region (the region's own link figure), and
- ``per_region`` peers of each other region (that region pair's figure),

O(local + per_region x regions), whatever N is. Who represents a region to
whom is rendezvous-hashed on the pair of peer ids, so the representatives
differ from prober to prober and no peer is probed by everyone, and every
peer (and the coordinator) computes the same targets from the same view.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

__all__ = ["probe_targets", "LOCAL_TARGETS", "PER_REGION_TARGETS"]

#: peers of the prober's own region it measures
LOCAL_TARGETS = 3
#: peers of each other region it measures
PER_REGION_TARGETS = 2


def _rank(me: str, other: str) -> bytes:
    return hashlib.sha256(f"{me}\0{other}".encode()).digest()


def probe_targets(
    me: str, regions: Mapping[str, str], *, local: int = LOCAL_TARGETS, per_region: int = PER_REGION_TARGETS
) -> list[str]:
    """The peers ``me`` probes, given every live peer's region (``regions``: peer id -> region), sorted.

    ``me`` needs an entry in ``regions``; peers absent from it are unknown and never targets.
    """
    if me not in regions:
        return []
    by_region: dict[str, list[str]] = {}
    for pid, region in regions.items():
        if pid != me:
            by_region.setdefault(region, []).append(pid)
    mine = regions[me]
    chosen: list[str] = []
    for region, pids in by_region.items():
        want = local if region == mine else per_region
        chosen.extend(sorted(pids, key=lambda p: _rank(me, p))[:want])
    return sorted(chosen)
