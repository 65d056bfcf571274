"""The coordinator's watch reads the progress records every tick and the peer records only when they can have
changed (a new peer reports progress) or every ``peers_every_s``; a replan plans on a fresh copy."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from geotrain.config import job_from_dict
from geotrain.coordinator.coordinator import Coordinator, CoordinatorConfig
from geotrain.plan import JobPlan, StageSlot
from geotrain.swarm.records import LinkMeasurement, LinkRow, PeerRecord, PeerStatus, ProgressRecord
from tests.swarm.test_records import peer_record


def progress(pid: str, status: PeerStatus = PeerStatus.TRAINING) -> ProgressRecord:
    return ProgressRecord(peer_id=pid, job_id="j", plan_version=1, step=3, tokens=0, round=0, bytes_sent=0,
                          bytes_received=0, updated_at=time.time(), status=status)


class Reads:
    """A swarm's read side, counting the reads of each dictionary."""

    def __init__(self) -> None:
        self.progress: dict[str, ProgressRecord] = {}
        self.peers: dict[str, PeerRecord] = {}
        self.counts = {"progress": 0, "peers": 0, "thorough": 0}

    def get_progress(self, thorough: bool = False) -> dict[str, ProgressRecord]:
        self.counts["progress"] += 1
        self.counts["thorough"] += thorough
        return dict(self.progress)

    def get_peers(self, thorough: bool = False) -> dict[str, PeerRecord]:
        self.counts["peers"] += 1
        return dict(self.peers)

    def get_digests(self, thorough: bool = False) -> dict[str, Any]:
        return {}  # peers of a version without digests (tests/coordinator/test_digests.py has them)


def coordinator(tmp_path: Path, reads: Reads, clock: list[float]) -> Coordinator:
    job = job_from_dict({"job": {"name": "t"}, "model": {"preset": "tiny"}})
    c = Coordinator(CoordinatorConfig(job_id="j", report_dir=tmp_path, peers_every_s=30.0), job,
                    swarm=reads, clock=lambda: clock[0])  # type: ignore[arg-type]
    c.plan = JobPlan(job_id="j", version=1, num_blocks=2, stop_step=10, pipelines=(
        (StageSlot(peer="A", start=0, end=1), StageSlot(peer="B", start=1, end=2)),
    ))
    return c


def test_the_peer_records_are_read_again_only_on_a_new_peer_or_after_peers_every_s(tmp_path: Path) -> None:
    reads, clock = Reads(), [0.0]
    reads.progress = {p: progress(p) for p in "AB"}
    reads.peers = {p: peer_record(p) for p in "AB"}
    c = coordinator(tmp_path, reads, clock)
    for t in (0.0, 5.0, 10.0, 29.0):
        clock[0] = t
        got, everyone = c._read_view()
        assert set(got) == set(everyone) == {"A", "B"}
    assert reads.counts == {"progress": 4, "peers": 1, "thorough": 0}  # one read of the peers in 29 s
    reads.progress["C"] = progress("C", PeerStatus.IDLE)  # a joiner reports: its record is read at once
    reads.peers["C"] = peer_record("C")
    clock[0] = 31.0
    assert set(c._read_view()[1]) == {"A", "B", "C"} and reads.counts["peers"] == 2
    clock[0] = 62.0  # nothing new, but peers_every_s passed
    c._read_view()
    assert reads.counts["peers"] == 3


def test_a_plan_peer_missing_from_the_quick_copies_is_read_from_every_replica(tmp_path: Path) -> None:
    reads, clock = Reads(), [0.0]
    reads.progress = {"A": progress("A")}  # B's progress expired (or one replica missed it)
    reads.peers = {p: peer_record(p) for p in "AB"}
    c = coordinator(tmp_path, reads, clock)
    got, everyone = c._read_view()
    assert set(got) == {"A"} and reads.counts["thorough"] == 1 and reads.counts["peers"] == 2


def test_a_replan_plans_on_fresh_peer_records_and_keeps_a_record_the_quick_read_missed(tmp_path: Path) -> None:
    reads, clock = Reads(), [0.0]
    reads.progress = {p: progress(p) for p in "AB"}
    old: dict[str, Any] = {p: peer_record(p) for p in "AB"}
    moved = peer_record("A").model_copy(update={"endpoint": "tcp://127.0.0.1:6001"})
    reads.peers = {"A": moved}  # A moved to a new port; B's record is missing from this replica
    c = coordinator(tmp_path, reads, clock)
    live = c._fresh_peers(old, reads.progress)
    assert live["A"].endpoint == "tcp://127.0.0.1:6001" and live["B"] == old["B"]


def test_each_peer_joins_once_per_run_across_planning_attempts(tmp_path: Path) -> None:
    """Plan v1 waits for peers again after an infeasible attempt: a peer seen before is no new join."""
    reads, clock = Reads(), [0.0]
    reads.progress = {p: progress(p, PeerStatus.IDLE) for p in "AB"}
    reads.peers = {p: peer_record(p) for p in "AB"}
    link = LinkMeasurement(bandwidth_bps=1e6, rtt_s=0.01, measured_at=time.time())
    rows = {a: LinkRow(src=a, links={b: link for b in "AB" if b != a}) for a in "AB"}
    reads.get_links = lambda thorough=False: rows  # type: ignore[attr-defined]
    c = coordinator(tmp_path, reads, clock)
    c.job = job_from_dict({"job": {"name": "t"}, "model": {"preset": "tiny"}, "swarm": {"min_peers": 2}})
    events: list[dict[str, Any]] = []
    c._emit = events.append  # type: ignore[method-assign]
    for _ in range(3):  # the first attempt and two retries
        assert set(c.wait_for_peers()) == {"A", "B"}
    assert sorted(e["peer_id"] for e in events if e["event"] == "join") == ["A", "B"]


def test_plan_v1_not_plannable_yet_says_why_once_per_reason(tmp_path: Path) -> None:
    from geotrain.errors import InfeasiblePlanError

    reads, clock = Reads(), [0.0]
    c = coordinator(tmp_path, reads, clock)
    events: list[dict[str, Any]] = []
    c._emit = events.append  # type: ignore[method-assign]
    c.config = replace(c.config, poll_s=0.0)
    c.wait_for_peers = lambda: {p: peer_record(p) for p in "AB"}  # type: ignore[method-assign]
    reasons = iter(["region 'home' has 2 peers but no link inside it"] * 3 + ["regions are disconnected: a | b"])

    def publish_plan(peers: Any, **kw: Any) -> None:
        reason = next(reasons, None)
        if reason is not None:
            raise InfeasiblePlanError(reason)

    c.publish_plan = publish_plan  # type: ignore[method-assign]
    c._first_plan(None)
    waiting = [e for e in events if e["event"] == "waiting"]
    assert [e["reason"] for e in waiting] == ["region 'home' has 2 peers but no link inside it",
                                              "regions are disconnected: a | b"]
    assert all(e["peers"] == 2 and e["wait_s"] > 0 for e in waiting)
