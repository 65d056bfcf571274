"""The coordinator's watch from region digests: O(regions) reads per tick, every peer's own record only when
the digests do not cover the plan, say something moved, or every ``full_read_every_s``; a lying collector
cannot keep a dead peer alive past the next full read (geotrain.coordinator.digests)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from geotrain.config import job_from_dict
from geotrain.coordinator.coordinator import Coordinator, CoordinatorConfig
from geotrain.coordinator.digests import cover
from geotrain.plan import JobPlan, StageSlot
from geotrain.swarm.digest import member_line
from geotrain.swarm.records import MemberProgress, PeerRecord, PeerStatus, ProgressRecord, RegionDigest
from tests.swarm.test_records import peer_record

PLAN = JobPlan(job_id="j", version=1, num_blocks=2, stop_step=100, spares=("S",), pipelines=(
    (StageSlot(peer="A", start=0, end=1, region="eu", endpoint="tcp://127.0.0.1:1"),
     StageSlot(peer="B", start=1, end=2, region="us", endpoint="tcp://127.0.0.1:2")),
    (StageSlot(peer="C", start=0, end=1, region="eu", endpoint="tcp://127.0.0.1:3"),
     StageSlot(peer="D", start=1, end=2, region="us", endpoint="tcp://127.0.0.1:4")),
))  # fmt: skip
REGION = {"A": "eu", "B": "us", "C": "eu", "D": "us", "S": "us"}


def record(pid: str, *, step: int = 3, at: float = 100.0, **changes: Any) -> ProgressRecord:
    fields: dict[str, Any] = dict(peer_id=pid, job_id="j", plan_version=1, step=step, tokens=step * 10, round=0,
                                  bytes_sent=0, bytes_received=0, updated_at=at, status=PeerStatus.TRAINING)
    fields.update(changes)
    return ProgressRecord(**fields)


def digests(lines: dict[str, MemberProgress], *, collectors: dict[str, str] | None = None,
            plan_version: int = 1) -> dict[str, RegionDigest]:
    """One digest per region of ``lines``, each from the region's plan collector (or ``collectors``')."""
    out: dict[str, RegionDigest] = {}
    for region in sorted({REGION[p] for p in lines}):
        who = (collectors or {}).get(region) or PLAN.collector(region)
        assert who is not None
        out[who] = RegionDigest(collector=who, job_id="j", plan_version=plan_version, region=region,
                                updated_at=200.0, members={p: m for p, m in lines.items() if REGION[p] == region})
    return out


def peers() -> dict[str, PeerRecord]:
    return {p: peer_record(p, region=r) for p, r in REGION.items()}


def test_lines_newer_than_the_full_read_move_step_and_tokens_and_keep_the_rest() -> None:
    full = {p: record(p, stats={"compute_s": 1.0}) for p in REGION}
    lines = {p: member_line(record(p, step=9, at=150.0)) for p in REGION}
    merged, why = cover(PLAN, digests(lines), full)
    assert why is None
    assert {p: (r.step, r.tokens, r.updated_at) for p, r in merged.items()} == {p: (9, 90, 150.0) for p in REGION}
    assert merged["A"].stats == {"compute_s": 1.0}  # the rest stays the peer's own record's


def test_anything_the_digests_cannot_vouch_for_asks_for_a_full_read() -> None:
    full = {p: record(p) for p in REGION}
    fine = {p: member_line(record(p, step=9, at=150.0)) for p in REGION}
    cases: dict[str, tuple[dict[str, RegionDigest], dict[str, ProgressRecord]]] = {
        "no digest covers D": (digests({p: m for p, m in fine.items() if p != "D"}), full),
        "A was not in the last full read": (digests(fine), {p: r for p, r in full.items() if p != "A"}),
        "B: status stalled": (digests({**fine, "B": member_line(record("B", at=150.0, status=PeerStatus.STALLED))}),
                              full),
        "D: lost blocks": (digests({**fine, "D": fine["D"].model_copy(update={"lost": True})}), full),
        "A: limiting links": (digests({**fine, "A": fine["A"].model_copy(update={"links": 1})}), full),
        "B: plan version": (digests({**fine, "B": fine["B"].model_copy(update={"plan_version": 2})}), full),
    }
    for expected, (ds, f) in cases.items():
        assert cover(PLAN, ds, f)[1] == expected
    # new checkpoint shards (a peer writes them every round) wait for the next full read
    assert cover(PLAN, digests({**fine, "C": fine["C"].model_copy(update={"shard_step": 8})}), full)[1] is None


def test_only_the_plans_collector_speaks_for_its_region_and_only_for_its_own_peers() -> None:
    full = {p: record(p) for p in REGION}
    fine = {p: member_line(record(p, step=9, at=150.0)) for p in REGION}
    # C is in eu but not eu's collector (A is): its digest is not believed, whatever it says
    forged = digests(fine, collectors={"eu": "C"})
    assert cover(PLAN, forged, full)[1] == "no digest covers A"
    # eu's collector listing us peers: ignored for them (B collects us, and sent no digest)
    ds = digests(fine)
    us = ds.pop("B")
    ds["A"] = ds["A"].model_copy(update={"members": {**ds["A"].members, **us.members}})
    assert cover(PLAN, ds, full)[1] == "no digest covers B"
    # a spare has no region in the plan: one in a region without plan peers reports to the first region's
    ds = digests(fine)
    ds["B"] = ds["B"].model_copy(update={"members": {p: m for p, m in ds["B"].members.items() if p != "S"}})
    assert cover(PLAN, ds, full)[1] == "no digest covers S"
    ds["A"] = ds["A"].model_copy(update={"members": {**ds["A"].members, "S": fine["S"]}})
    assert cover(PLAN, ds, full)[1] is None
    # a digest of an older plan version says nothing about this one
    assert cover(PLAN, digests(fine, plan_version=0), full)[1] == "no digest covers A"


def test_a_line_older_than_the_peers_own_record_changes_nothing() -> None:
    full = {p: record(p, step=12, at=180.0) for p in REGION}
    lines = {p: member_line(record(p, step=9, at=150.0, status=PeerStatus.IDLE)) for p in REGION}
    merged, why = cover(PLAN, digests(lines), full)
    assert why is None and all(r.step == 12 for r in merged.values())


class Reads:
    """A swarm's read side: progress records, peer records and region digests, counting the reads."""

    def __init__(self) -> None:
        self.progress: dict[str, ProgressRecord] = {}
        self.peers = peers()
        self.digests: dict[str, RegionDigest] = {}
        self.counts = {"progress": 0, "peers": 0, "digest": 0}

    def get_progress(self, thorough: bool = False) -> dict[str, ProgressRecord]:
        self.counts["progress"] += 1
        return dict(self.progress)

    def get_peers(self, thorough: bool = False) -> dict[str, PeerRecord]:
        self.counts["peers"] += 1
        return dict(self.peers)

    def get_digests(self, thorough: bool = False) -> dict[str, RegionDigest]:
        self.counts["digest"] += 1
        return dict(self.digests)


def coordinator(tmp_path: Path, reads: Reads, clock: list[float]) -> Coordinator:
    job = job_from_dict({"job": {"name": "t"}, "model": {"preset": "tiny"}})
    c = Coordinator(CoordinatorConfig(job_id="j", report_dir=tmp_path, full_read_every_s=60.0), job,
                    swarm=reads, clock=lambda: clock[0])  # type: ignore[arg-type]
    c.plan = PLAN
    return c


def test_covered_ticks_read_the_digests_only_and_every_record_every_full_read_every_s(tmp_path: Path) -> None:
    reads, clock = Reads(), [0.0]
    now = time.time()
    reads.progress = {p: record(p, at=now) for p in REGION}
    c = coordinator(tmp_path, reads, clock)
    c._read_view()  # the first tick reads everything: there is nothing to lay the digests over
    assert reads.counts == {"progress": 1, "peers": 1, "digest": 0}
    for t in range(10, 60, 10):
        clock[0] = float(t)
        reads.digests = digests({p: member_line(record(p, step=t, at=now + t)) for p in REGION})
        got, everyone = c._read_view()
        assert {r.step for r in got.values()} == {t} and set(everyone) == set(REGION)
    assert reads.counts == {"progress": 1, "peers": 1, "digest": 5}
    clock[0] = 60.0
    c._read_view()
    assert reads.counts["progress"] == 2 and c.reads == {"digest": 5, "covered": 5, "full": 2}


def test_a_lying_collector_keeps_a_dead_peer_alive_only_until_the_next_full_read(tmp_path: Path) -> None:
    reads, clock = Reads(), [0.0]
    now = time.time()
    reads.progress = {p: record(p, at=now) for p in REGION}
    c = coordinator(tmp_path, reads, clock)
    c._read_view()
    del reads.progress["B"]  # B died: its own record expired
    reads.digests = digests({p: member_line(record(p, step=5, at=now + 1)) for p in REGION})  # us still lists it
    clock[0] = 30.0
    assert "B" in c._read_view()[0]
    clock[0] = 61.0
    got, _ = c._read_view()
    assert "B" not in got  # the full read: B's progress is gone, decide() takes it for missing


def test_without_digests_every_tick_reads_every_record_as_before(tmp_path: Path) -> None:
    reads, clock = Reads(), [0.0]
    reads.progress = {p: record(p, at=time.time()) for p in REGION}
    c = coordinator(tmp_path, reads, clock)
    for t in (0.0, 10.0, 20.0):
        clock[0] = t
        assert set(c._read_view()[0]) == set(REGION)
    assert reads.counts["progress"] == 3 and reads.counts["digest"] == 2
