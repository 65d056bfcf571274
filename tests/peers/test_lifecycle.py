"""The peer agent's main-loop choices (geotrain.peers.lifecycle): plans adopted or ignored, the stop moved,
spares waiting, finishing at the stop step, a stall reported once and given up after ``stall_wait_s``; on
virtual time, no swarm."""

from __future__ import annotations

from dataclasses import replace

from geotrain.peers.lifecycle import Adopt, Failure, MoveStop, after_failure, next_work, plan_change
from geotrain.plan import JobPlan, StageSlot


def plan(version: int = 1, *, job: str = "j", stop: int | None = 50, spares: tuple[str, ...] = ()) -> JobPlan:
    return JobPlan(job_id=job, version=version, num_blocks=2, stop_step=stop, spares=spares,
                   pipelines=((StageSlot(peer="A", start=0, end=1), StageSlot(peer="B", start=1, end=2)),))


def test_a_newer_version_or_another_job_is_adopted_an_older_one_ignored() -> None:
    assert plan_change(None, None) is None
    assert plan_change(None, plan(3)) == Adopt(plan(3))  # the first plan seen
    assert plan_change(plan(2), plan(3)) == Adopt(plan(3))
    assert plan_change(plan(3), plan(2)) is None  # an older plan (a slow replica) changes nothing
    assert plan_change(plan(3), plan(3)) is None
    assert plan_change(plan(3), plan(1, job="k")) == Adopt(plan(1, job="k"))  # a new job starts at its own v1


def test_the_same_version_with_another_stop_only_moves_the_stop() -> None:
    assert plan_change(plan(2, stop=50), plan(2, stop=31)) == MoveStop(31)
    assert plan_change(plan(2, stop=None), plan(2, stop=31)) == MoveStop(31)
    # a newer version is a rebuild even when only its stop differs
    assert plan_change(plan(2, stop=50), plan(3, stop=31)) == Adopt(plan(3, stop=31))


def test_a_spare_or_a_failed_build_waits_a_placed_peer_steps_until_its_stop() -> None:
    p = plan(stop=40)
    assert next_work(None, has_worker=False, step=0) == "wait"
    assert next_work(replace(p, spares=("C",)), has_worker=False, step=0) == "wait"  # a spare: no worker
    assert next_work(p, has_worker=True, step=39) == "step"
    assert next_work(p, has_worker=True, step=40) == "finish"
    assert next_work(p, has_worker=True, step=41) == "finish"  # a stop moved behind the peer: it finishes
    assert next_work(plan(stop=None), has_worker=True, step=10**6) == "step"  # no stop: the coordinator sets one


def test_a_stall_is_reported_once_and_given_up_after_stall_wait_s() -> None:
    first = after_failure(None, 100.0, stall_wait_s=120.0)
    assert first == Failure(since=100.0, report=True, give_up=False)
    again = after_failure(first.since, 150.0, stall_wait_s=120.0)
    assert again == Failure(since=100.0, report=False, give_up=False)  # the retries do not report again
    assert after_failure(first.since, 220.0, stall_wait_s=120.0).give_up is False  # exactly the wait: not yet
    assert after_failure(first.since, 220.5, stall_wait_s=120.0) == Failure(since=100.0, report=False, give_up=True)
