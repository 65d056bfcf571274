"""The coordinator's side of the progress digests (:mod:`geotrain.swarm.digest`): pure, so unit-testable.

:func:`cover` lays the lines of this tick's region digests over the peers' own progress records of the
last full read. It returns the merged view, or why this tick must read the peers' own records instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from geotrain.plan import JobPlan
from geotrain.swarm.records import MemberProgress, ProgressRecord, RegionDigest


def accepted_lines(plan: JobPlan, digests: Mapping[str, RegionDigest]) -> dict[str, MemberProgress]:
    """The lines this coordinator believes: from the collector the plan names for the digest's region, of this
    plan version, for a peer the plan places in that region, or a spare (the plan gives spares no region: one
    in a region without plan peers reports to the first region's collector)."""
    out: dict[str, MemberProgress] = {}
    spares = set(plan.spares)
    for collector, d in digests.items():
        if d.job_id != plan.job_id or d.plan_version != plan.version or plan.collector(d.region) != collector:
            continue
        for pid, line in d.members.items():
            placed = plan.region_of(pid)
            if placed == d.region or pid in spares:
                out[pid] = line
    return out


def _moved(line: MemberProgress, own: ProgressRecord) -> str | None:
    """What the line says changed since the peer's own record that the watch must act on and only the record
    itself details. New checkpoint shards are not among them: a peer writes them every round, and the manifests
    built from them may lag by one full read (``full_read_every_s``)."""
    if line.plan_version != own.plan_version:
        return "plan version"
    if line.status != own.status:
        return f"status {line.status.value}"
    if line.lost != ("lost_round" in own.stats):
        return "lost blocks"
    if line.links != len(own.links_in):
        return "limiting links"
    return None


def cover(plan: JobPlan, digests: Mapping[str, RegionDigest],
          full: Mapping[str, ProgressRecord]) -> tuple[dict[str, ProgressRecord], str | None]:
    """``full`` (the last full read's progress records) with each plan peer's and spare's step, round, tokens,
    loss and time taken from its digest line where that is newer; and None, or the reason (naming a peer) the
    tick must read every peer's own record: a peer no digest covers, one the last full read lacked, or a line
    that says something moved that its line does not carry (status, plan version, lost blocks, links).
    """
    lines = accepted_lines(plan, digests)
    merged = dict(full)
    for pid in (*plan.peers, *plan.spares):
        line = lines.get(pid)
        if line is None:
            return merged, f"no digest covers {pid}"
        own = full.get(pid)
        if own is None:
            return merged, f"{pid} was not in the last full read"
        if line.updated_at < own.updated_at:
            continue  # its own record is newer than the collector's copy of its line
        why = _moved(line, own)
        if why is not None:
            return merged, f"{pid}: {why}"
        merged[pid] = own.model_copy(update={"step": line.step, "round": line.round, "tokens": line.tokens,
                                              "loss": line.loss, "updated_at": line.updated_at})
    return merged, None
