"""The peer agent's choices in its main loop: pure functions of its plan, the newest plan seen, and time.

The agent (:class:`geotrain.peers.agent.PeerAgent`) is the I/O shell: each pass
it reads the newest (job, plan) its watcher saw, asks :func:`plan_change` what
that means, then :func:`next_work` what to do with its own plan, and after a
failed step :func:`after_failure` whether to report a stall or give up. Its
status (:class:`~geotrain.swarm.records.PeerStatus`) follows (the transition
table in docs/architecture.md):

- a newer plan version of the same job, or any plan of another job, is adopted
  (``joining``, then ``training`` once the worker is built, or ``spare``); an
  older or equal version is ignored, except that the same version with another
  stop step only moves the stop (nothing is rebuilt);
- with no worker (a spare, or a build that failed) the agent waits for news;
- at the plan's stop step it finishes (``done``), else it runs the next step;
- a failed step reports ``stalled`` once, retries (with backoff) while a newer
  plan has not come, and leaves the job after ``stall_wait_s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from geotrain.plan import JobPlan


@dataclass(frozen=True)
class Adopt:
    """Build this peer's part of ``plan`` (or become its spare)."""

    plan: JobPlan


@dataclass(frozen=True)
class MoveStop:
    """The coordinator moved the stop of the current plan version (tokens, time or budget reached)."""

    stop_step: int | None


def plan_change(mine: JobPlan | None, latest: JobPlan | None) -> Adopt | MoveStop | None:
    """What the newest plan seen means for a peer following ``mine``: adopt it, move the stop, or nothing."""
    if latest is None:
        return None
    if mine is None or latest.job_id != mine.job_id or latest.version > mine.version:
        return Adopt(latest)
    if latest.version == mine.version and latest.stop_step != mine.stop_step:
        return MoveStop(latest.stop_step)
    return None


Work = Literal["wait", "finish", "step"]


def next_work(plan: JobPlan | None, *, has_worker: bool, step: int) -> Work:
    """``wait`` for news (no plan, or no stage in it), ``finish`` at the stop step, else ``step``."""
    if plan is None or not has_worker:
        return "wait"
    if plan.stop_step is not None and step >= plan.stop_step:
        return "finish"
    return "step"


@dataclass(frozen=True)
class Failure:
    """What a failed step means: ``since`` the first failure of this stall; ``report`` it (the first failure
    only); ``give_up`` the job (no newer plan within ``stall_wait_s``)."""

    since: float
    report: bool
    give_up: bool


def after_failure(stalled_since: float | None, now: float, stall_wait_s: float) -> Failure:
    """A step failed at ``now`` (monotonic); ``stalled_since`` is when this stall began, None if it just did."""
    since = now if stalled_since is None else stalled_since
    return Failure(since=since, report=stalled_since is None, give_up=now - since > stall_wait_s)
