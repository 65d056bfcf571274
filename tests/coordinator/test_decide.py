"""The coordinator's watch rules on virtual time (geotrain.coordinator.decide): no swarm, no clock, no sleep.

Each test drives :func:`decide` tick by tick with the times it chooses, as the coordinator's loop would
with its monotonic clock, and checks the actions it would carry out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

import pytest

from geotrain.coordinator.decide import (
    Action,
    Death,
    EndWatch,
    LinkDegraded,
    Memory,
    Missing,
    Policy,
    Replan,
    RequestStop,
    Stall,
    StateLost,
    View,
    decide,
    next_due,
    restart_steps,
)
from geotrain.errors import ConfigError
from geotrain.plan import JobPlan, StageSlot
from geotrain.swarm.records import InboundLinkReport, PeerStatus, ProgressRecord

POLICY = Policy(replan_grace_s=3.0, stall_replan_s=10.0, join_grace_s=5.0, finish_timeout_s=60.0,
                link_degraded_ratio=0.5, link_replan_s=30.0, every=10)


def plan(*, version: int = 1, start: int = 0, stop: int | None = 100, spares: tuple[str, ...] = ()) -> JobPlan:
    """Two pipelines of two stages: A -> B and C -> D; groups {A, C} and {B, D}."""
    return JobPlan(job_id="j", version=version, num_blocks=2, start_step=start, stop_step=stop, spares=spares,
                   pipelines=((StageSlot(peer="A", start=0, end=1), StageSlot(peer="B", start=1, end=2)),
                              (StageSlot(peer="C", start=0, end=1), StageSlot(peer="D", start=1, end=2))))


def rec(pid: str, *, step: int = 25, version: int = 1, status: PeerStatus = PeerStatus.TRAINING,
        **changes: object) -> ProgressRecord:
    fields: dict[str, object] = dict(peer_id=pid, job_id="j", plan_version=version, step=step, tokens=0, round=0,
                                     bytes_sent=0, bytes_received=0, updated_at=0.0, status=status)
    fields.update(changes)
    return ProgressRecord(**fields)  # type: ignore[arg-type]


class Watch:
    """The coordinator's loop without I/O: feeds ticks to :func:`decide`, keeps its memory."""

    def __init__(self, p: JobPlan, policy: Policy = POLICY) -> None:
        self.plan, self.policy, self.memory = p, policy, Memory()

    def tick(self, now: float, progress: Mapping[str, ProgressRecord] | None = None, *,
             live: Iterable[str] | None = None, joiners: Iterable[str] = (),
             assumed: Mapping[tuple[str, str], float] | None = None, limit: bool = False) -> list[Action]:
        progress = {p: rec(p) for p in self.plan.peers} if progress is None else progress
        view = View(plan=self.plan, progress=progress, live=frozenset(progress if live is None else live),
                    joiners=frozenset(joiners), assumed=assumed or {}, limit_reached=limit)
        self.memory, actions = decide(self.memory, view, now, self.policy)
        return actions


def kinds(actions: list[Action]) -> list[type]:
    return [type(a) for a in actions]


def test_a_healthy_swarm_needs_nothing() -> None:
    w = Watch(plan())
    assert all(w.tick(t) == [] for t in range(0, 100, 5))


def test_a_missing_peer_is_dead_only_after_the_grace_and_a_blip_is_forgiven() -> None:
    w = Watch(plan())
    alive = ["A", "B", "C"]
    assert w.tick(0.0, live=alive) == [Missing("D")]
    assert w.tick(2.9, live=alive) == []  # inside the grace: noticed once, nothing else
    assert w.tick(3.0, live=alive + ["D"]) == []  # back: a blip
    assert w.tick(4.0, live=alive) == [Missing("D")]  # gone again: the grace starts over
    assert w.tick(6.9, live=alive) == []
    assert w.tick(7.1, live=alive) == [Death("D"), Replan("death", 20, 20)]
    assert w.memory.missing_since == {}


def test_a_replan_numbers_on_from_the_furthest_peer_and_takes_state_as_old_as_the_slowest() -> None:
    p = plan(start=10)
    progress = {"A": rec("A", step=47), "B": rec("B", step=33), "C": rec("C", step=52),
                "D": rec("D", step=12)}
    # numbering: C's last boundary, so no step is trained twice; state: as old as D's last boundary
    assert restart_steps(p, progress, frozenset("ABCD"), 10) == (50, 10)
    assert restart_steps(p, progress, frozenset("ABD"), 10) == (40, 10)  # a dead peer's step counts for neither
    assert restart_steps(p, progress, frozenset("ABC"), 10) == (50, 30)
    older = {**progress, "B": rec("B", step=3, version=0)}  # a report from before this plan does not count
    assert restart_steps(p, older, frozenset("ABC"), 10) == (50, 40)
    assert restart_steps(p, {}, frozenset(), 10) == (10, 10)  # nobody reported: the plan's own start
    assert restart_steps(plan(start=40), progress, frozenset("ABCD"), 10) == (50, 40)  # never before its start
    follow = replace(plan(start=60), state_step=40)  # nobody reported under a plan that took older state
    assert restart_steps(follow, {}, frozenset(), 10) == (60, 40)


def test_a_plan_refuses_a_state_step_past_its_start_and_carries_it_on_the_wire() -> None:
    p = replace(plan(start=50), state_step=30)
    assert p.state_floor == 30 and plan(start=50).state_floor == 50
    assert JobPlan.from_dict(p.to_dict()) == p
    legacy = p.to_dict()
    del legacy["state_step"]  # a plan written before the field: its state floor is its start
    assert JobPlan.from_dict(legacy).state_floor == 50
    for bad in (60, -1):
        with pytest.raises(ConfigError, match="state_step"):
            replace(plan(start=50), state_step=bad)


def test_a_stalled_peer_gets_a_plan_after_stall_replan_s() -> None:
    w = Watch(plan())
    stuck = {**{p: rec(p) for p in "ABC"}, "D": rec("D", status=PeerStatus.STALLED)}
    assert w.tick(0.0, stuck) == []
    assert w.tick(10.0, stuck) == []
    assert w.tick(10.5, stuck) == [Stall(("D",)), Replan("stall", 20, 20)]
    assert w.memory.stalled_since == {}
    # a stall reported under an older plan version is not this plan's
    w = Watch(plan(version=2))
    old = {**{p: rec(p, version=2) for p in "ABC"}, "D": rec("D", version=1, status=PeerStatus.STALLED)}
    assert w.tick(0.0, old) == [] and w.tick(60.0, old) == []


def test_a_death_beside_a_stall_is_replanned_as_a_death_with_no_stall_event() -> None:
    w = Watch(plan())
    progress = {**{p: rec(p) for p in "AB"}, "C": rec("C", status=PeerStatus.STALLED)}
    w.tick(0.0, progress, live="ABC")
    assert w.tick(11.0, progress, live="ABC") == [Death("D"), Replan("death", 20, 20)]


def test_a_burst_of_joiners_costs_one_replan_after_the_join_grace() -> None:
    w = Watch(plan())
    assert w.tick(0.0, joiners=["E"]) == []
    assert w.tick(3.0, joiners=["E", "F"]) == []  # a second joiner does not restart the grace ...
    assert w.tick(5.5, joiners=["E", "F"]) == [Replan("join", 20, 20)]  # ... nor cost a second plan
    assert w.memory.joiner_since is None
    assert w.tick(6.0) == []


def test_the_next_tick_comes_when_a_grace_ends_not_a_read_period_later() -> None:
    """A shell that waits for ``next_due`` acts on each timer at its threshold, however long its read period."""
    w = Watch(plan())
    assert next_due(w.memory, 0.0, POLICY) is None  # nothing pending: the read period decides
    assert w.tick(0.0, joiners=["E"]) == []
    due = next_due(w.memory, 0.0, POLICY)
    assert due is not None and 5.0 < due < 5.2  # the join grace, just past its threshold
    assert w.tick(due, joiners=["E"]) == [Replan("join", 20, 20)]
    assert next_due(w.memory, due, POLICY) is None
    # a missing peer: the tick at its due time finds it dead; the earliest of several timers comes first
    stuck = {**{p: rec(p) for p in "AB"}, "C": rec("C", status=PeerStatus.STALLED)}
    w.tick(10.0, stuck, live="ABC")
    due = next_due(w.memory, 10.0, POLICY)
    assert due is not None and 13.0 < due < 13.2  # D's grace (3 s) before C's stall (10 s)
    assert w.tick(due, stuck, live="ABC") == [Death("D"), Replan("death", 20, 20)]
    # a timer whose time has passed (its tick declined to act) never asks for a tick at once, again and again
    late = Memory(joiner_since=0.0)
    assert next_due(late, 30.0, POLICY) is None
    assert next_due(Memory(finish_deadline=70.0), 30.0, POLICY) == 70.05


def test_a_joiner_that_leaves_before_the_grace_costs_nothing() -> None:
    w = Watch(plan())
    w.tick(0.0, joiners=["E"])
    assert w.tick(4.0) == [] and w.memory.joiner_since is None
    assert w.tick(6.0, joiners=["E"]) == []  # back: its grace starts over
    assert w.tick(11.5, joiners=["E"]) == [Replan("join", 20, 20)]


def test_a_spare_that_dies_costs_no_replan() -> None:
    w = Watch(plan(spares=("S",)))
    live = "ABCD"  # S is gone
    assert w.tick(0.0, live=live) == [] and w.tick(30.0, live=live) == []


def test_a_peer_the_new_plan_left_out_is_not_mourned_after_the_replan() -> None:
    w = Watch(plan())
    assert w.tick(0.0, joiners=["E"]) == []
    assert w.tick(4.0, live="ABC", joiners=["E"]) == [Missing("D")]
    assert w.tick(5.1, live="ABC", joiners=["E"]) == [Replan("join", 20, 20)]  # D missing 1.1 s: not dead yet
    # the join replan planned on the live peers, without D: D is no longer this watch's to declare dead
    w.plan = JobPlan(job_id="j", version=2, num_blocks=2, start_step=20, stop_step=100,
                     pipelines=((StageSlot(peer="A", start=0, end=1), StageSlot(peer="B", start=1, end=2)),
                                (StageSlot(peer="C", start=0, end=1), StageSlot(peer="E", start=1, end=2))))
    assert w.tick(10.0, {p: rec(p, version=2, step=21) for p in "ABCE"}) == []
    assert w.memory.missing_since == {}


def test_done_ends_the_watch_and_needs_every_plan_peer_done_under_this_plan() -> None:
    w = Watch(plan())
    all_done = {p: rec(p, status=PeerStatus.DONE) for p in "ABCD"}
    assert w.tick(0.0, {**all_done, "D": rec("D")}) == []
    assert w.tick(1.0, {**all_done, "D": rec("D", version=0, status=PeerStatus.DONE)}) == []
    assert w.tick(2.0, all_done) == [EndWatch("done")]
    assert Watch(plan(stop=None)).tick(0.0, all_done) == []  # a plan with no stop step is never done


def test_lost_state_ends_the_watch_naming_blocks_and_round_before_any_replan() -> None:
    w = Watch(plan())
    lost = {**{p: rec(p) for p in "AB"},
            "C": rec("C", stats={"lost_round": 4.0, "lost:0-1": 1.0}),
            "D": rec("D", stats={"lost_round": 3.0, "lost:1-2": 1.0, "lost:x-y": 1.0})}
    w.tick(0.0, lost, joiners=["E"])
    assert w.tick(9.0, lost, joiners=["E"]) == [StateLost((0, 1), 3), EndWatch("state_lost")]


def test_a_stop_limit_asks_once_then_gives_the_peers_the_finish_timeout() -> None:
    w = Watch(plan(stop=100))
    progress = {p: rec(p, step=s) for p, s in zip("ABCD", (30, 31, 33, 29), strict=True)}
    assert w.tick(0.0, progress, limit=True) == [RequestStop(35)]
    assert w.tick(1.0, progress, limit=True) == [RequestStop(35)]  # the write failed: the plan still says 100
    w.plan = replace(w.plan, stop_step=35)
    assert w.tick(2.0, progress, limit=True) == []
    assert w.tick(60.0, progress, limit=True) == []
    assert w.tick(60.1, progress, limit=True) == [EndWatch("finish_timeout")]
    # a plan that already stops sooner is left as it is
    assert Watch(plan(stop=32)).tick(0.0, progress, limit=True) == []


def test_a_link_below_its_share_for_link_replan_s_is_replanned_around() -> None:
    w = Watch(plan())
    assumed = {("A", "B"): 1e6, ("C", "D"): 1e6}
    slow = {**{p: rec(p) for p in "ACD"},
            "B": rec("B", links_in={"A": InboundLinkReport(bandwidth_bps=2e5, messages=40, queued=30)})}
    kept_up = {**slow, "B": rec("B", links_in={"A": InboundLinkReport(bandwidth_bps=6e5, messages=40, queued=30)})}
    assert w.tick(0.0, slow, assumed=assumed) == []
    assert w.tick(20.0, kept_up, assumed=assumed) == []  # it kept up once: the 30 s start over
    assert w.tick(25.0, slow, assumed=assumed) == []
    missed = {p: r for p, r in slow.items() if p != "B"}  # B's record missed by one read: the clock runs on
    assert w.tick(40.0, missed, live="ABCD", assumed=assumed) == []
    assert w.tick(55.0, slow, assumed=assumed) == [LinkDegraded("A", "B", 2e5, 1e6, 30, 40), Replan("link", 20, 20)]
    assert w.memory.degraded_since == {}
    off = Watch(plan(), replace(POLICY, link_degraded_ratio=0.0))  # the default: measured, never replanned for
    assert off.tick(0.0, slow, assumed=assumed) == [] and off.tick(100.0, slow, assumed=assumed) == []


def test_the_rules_read_no_clock_the_same_ticks_give_the_same_actions() -> None:
    def run() -> list[list[type]]:
        w = Watch(plan())
        return [kinds(w.tick(t, live="ABC", joiners=["E"] if t > 2 else [])) for t in (0.0, 1.0, 2.5, 3.5, 8.0)]

    # after the replan the (unchanged) plan still names D: it is noticed missing again, its grace starts over
    assert run() == run() == [[Missing], [], [], [Death, Replan], [Missing]]


def test_a_replan_before_the_first_round_after_a_resume_is_still_that_resume() -> None:
    """Plan v1 of a resume may name peers that are gone (their records outlive a crash by a liveness period):
    the replan around them still resumes from the checkpoint, so peers new to the job ask for that step's state,
    which the holders answer from their state directories."""
    resumed = replace(plan(start=20), resume_step=20)
    w = Watch(resumed)
    fresh = {p: rec(p, step=20) for p in "ABC"}  # none reported a committed round past the resume
    assert w.tick(0.0, fresh, live="ABC") == [Missing("D")]
    assert w.tick(3.5, fresh, live="ABC") == [Death("D"), Replan("death", 20, 20, resume_step=20)]
    # once a live peer reported the next round, the replan starts from the trained state: no resume any more
    w = Watch(resumed)
    trained = {p: rec(p, step=30) for p in "ABC"}
    w.tick(0.0, trained, live="ABC")
    assert w.tick(3.5, trained, live="ABC") == [Death("D"), Replan("death", 30, 30)]
    w = Watch(plan(start=20))  # a plan that was no resume carries none
    w.tick(0.0, fresh, live="ABC")
    assert w.tick(3.5, fresh, live="ABC") == [Death("D"), Replan("death", 20, 20)]
