"""Which peers a peer probes: a few in its own region and representatives of every other region.

Why not all pairs? Probing every other peer is O(N) per peer and O(N^2) for the
swarm, in bytes (bulk transfers of a few MiB each) and in time. The planner
reasons mostly by region: a region pair's figure is the median of the measured
pairs between them (``geotrain.coordinator.planning``), and an unmeasured pair
is priced by its regions' figure (an *estimated* link). So a peer measures:

- ``local`` peers of its own region (the region's own link figure), and
- ``per_region`` peers of each other region (that region pair's figure),

O(local + per_region x regions), whatever N is. Who represents a region to
whom is rendezvous-hashed on the pair of peer ids, so the representatives
differ from prober to prober and no peer is probed by everyone, and every
peer (and the coordinator) computes the same targets from the same view.

Who measures a pair? The younger peer (the one whose record says it started
later), given ``started``: a peer chooses its targets among the peers that
were there before it, so a joiner probes O(regions) older peers and none of
them probes it back. A new peer therefore costs the swarm one joiner's probes,
whatever N is. (A pair one side measured stands for both directions in the
planner.) The plan's partners are probed on top of this, by both sides.
A peer nobody can dial (behind NAT, ``dial_out``) is nobody's target, and it
probes its targets whatever their age: it is the only side that can.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping

__all__ = ["probe_targets", "LOCAL_TARGETS", "PER_REGION_TARGETS"]

#: peers of the prober's own region it measures
LOCAL_TARGETS = 3
#: peers of each other region it measures
PER_REGION_TARGETS = 2


def _rank(me: str, other: str) -> bytes:
    return hashlib.sha256(f"{me}\0{other}".encode()).digest()


def probe_targets(
    me: str,
    regions: Mapping[str, str],
    *,
    started: Mapping[str, float] | None = None,
    dial_out: Collection[str] = (),
    local: int = LOCAL_TARGETS,
    per_region: int = PER_REGION_TARGETS,
) -> list[str]:
    """The peers ``me`` probes, given every live peer's region (``regions``: peer id -> region), sorted.

    ``me`` needs an entry in ``regions``; peers absent from it are unknown and never targets.
    ``started`` (peer id -> start time): only peers that started before ``me`` are candidates
    (ties broken by peer id); a peer missing from it counts as older. None: every peer is one.
    ``dial_out``: the peers nobody can dial; never targets, and ages do not limit their own targets.
    """
    if me not in regions:
        return []

    def older(pid: str) -> bool:
        if started is None or me not in started or pid not in started or me in dial_out:
            return True
        return (started[pid], pid) < (started[me], me)

    by_region: dict[str, list[str]] = {}
    for pid, region in regions.items():
        if pid != me and pid not in dial_out and older(pid):
            by_region.setdefault(region, []).append(pid)
    mine = regions[me]
    chosen: list[str] = []
    for region, pids in by_region.items():
        want = local if region == mine else per_region
        chosen.extend(sorted(pids, key=lambda p: _rank(me, p))[:want])
    return sorted(chosen)
