"""The coordinator's decisions while a job runs: a pure function of what it saw and when.

What is a tick? One pass of the coordinator's watch loop: it reads the swarm
(progress and peer records), then asks :func:`decide` what to do. The
coordinator's loop (:meth:`geotrain.coordinator.Coordinator.run`) is the I/O
shell around it: it reads, calls ``decide``, and carries out the actions in
order (events, a replan, a stop request, the end of the watch).

``decide(memory, view, now, policy) -> (memory, actions)`` reads no clock, no
DHT and no network: ``now`` is the caller's monotonic clock, ``memory`` is what
earlier ticks noticed (since when a peer has been missing, stalled, a joiner
waiting, a link degraded; the finish deadline). So the coordinator's rules have
deterministic unit tests on virtual time (tests/coordinator/test_decide.py):

- **death**: a plan peer missing from the view (no live record, or one that
  says it left) for more than ``replan_grace_s`` (a blip of one read is not a
  death);
- **stall**: a plan peer that reports :attr:`PeerStatus.STALLED` under the
  current plan version for more than ``stall_replan_s`` (a neighbour failed it
  and nothing rebuilt its stage);
- **join**: live peers outside the plan and its spares, with their links
  measured, waiting more than ``join_grace_s`` (a burst of joiners costs one
  replan);
- **link**: a hop direction of the plan measured below
  ``link_degraded_ratio`` of the plan's figure for ``link_replan_s``;
- a replan restarts at the last round boundary (a multiple of ``sync.every``)
  that no live plan peer under this plan version has passed, never before the
  plan's own start;
- **done**: every plan peer reports ``done`` under the current plan (which has a
  stop step); **state lost**: a plan peer found no holder for some blocks: both
  end the watch, before any replan of the same tick;
- a stop limit (tokens, wall time, budget) reached: a stop request (the same
  plan with its stop step just ahead of the furthest peer; asked again while the
  published stop is further, as after a failed write), then the watch ends
  after ``finish_timeout_s`` if the peers never report done.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from geotrain.plan import JobPlan
from geotrain.swarm.records import PeerStatus, ProgressRecord

Link = tuple[str, str]  # (src, dst): one hop direction
ReplanReason = Literal["death", "join", "stall", "link"]


@dataclass(frozen=True, kw_only=True)
class Policy:
    """The watch's thresholds (from CoordinatorConfig and the job's swarm and sync sections)."""

    replan_grace_s: float = 3.0
    stall_replan_s: float = 10.0
    join_grace_s: float = 5.0
    finish_timeout_s: float = 120.0
    link_degraded_ratio: float = 0.0  # 0: links that degrade are measured and reported, never replanned for
    link_replan_s: float = 30.0
    every: int = 10  # sync.every: rounds fall on multiples of it


@dataclass(frozen=True, kw_only=True)
class View:
    """What one read of the swarm showed, and what the coordinator knows besides.

    ``live`` are the peers with a live peer record and a progress record of this job that does not say
    ``left``; ``joiners`` the live peers outside the plan and its spares whose probe targets are measured
    (they can be placed); ``assumed`` the plan's bandwidth per hop direction (bytes/s, the hop's fair
    share); ``limit_reached`` whether a token, wall-time or budget limit of the job is reached.
    """

    plan: JobPlan
    progress: Mapping[str, ProgressRecord]
    live: frozenset[str]
    joiners: frozenset[str] = frozenset()
    assumed: Mapping[Link, float] = field(default_factory=dict)
    limit_reached: bool = False


@dataclass(frozen=True, kw_only=True)
class Memory:
    """What earlier ticks noticed, each a time on the caller's monotonic clock."""

    missing_since: Mapping[str, float] = field(default_factory=dict)
    stalled_since: Mapping[str, float] = field(default_factory=dict)
    joiner_since: float | None = None
    degraded_since: Mapping[Link, float] = field(default_factory=dict)
    finish_deadline: float | None = None


# -- actions, in the order the shell carries them out ---------------------------------------------------------
@dataclass(frozen=True)
class Missing:
    """A plan peer left the view this tick (logged; a death only after the grace)."""

    peer: str


@dataclass(frozen=True)
class Death:
    peer: str


@dataclass(frozen=True)
class Stall:
    peers: tuple[str, ...]


@dataclass(frozen=True)
class LinkDegraded:
    src: str
    dst: str
    measured_bps: float
    assumed_bps: float
    queued: int
    messages: int


@dataclass(frozen=True)
class Replan:
    reason: ReplanReason
    start_step: int
    #: the oldest committed state the next plan may start from (:func:`restart_steps`)
    state_step: int | None = None
    #: still a resume from this checkpoint step (:func:`carried_resume`): no round committed since it
    resume_step: int | None = None


@dataclass(frozen=True)
class StateLost:
    blocks: tuple[int, ...]
    round: int


@dataclass(frozen=True)
class RequestStop:
    """Move the plan's stop step just ahead of the furthest peer (same plan version)."""

    stop_step: int


@dataclass(frozen=True)
class EndWatch:
    """The watch loop ends; the coordinator finishes the job (final evaluation, report)."""

    reason: Literal["done", "state_lost", "finish_timeout"]


Action = Missing | Death | Stall | LinkDegraded | Replan | StateLost | RequestStop | EndWatch


def decide(memory: Memory, view: View, now: float, policy: Policy) -> tuple[Memory, list[Action]]:
    """One tick of the watch: the new memory and the actions to carry out, in order (module docstring)."""
    plan = view.plan
    plan_peers = list(plan.peers)
    actions: list[Action] = []

    missing = dict(memory.missing_since)
    for pid in plan_peers:
        if pid in view.live:
            missing.pop(pid, None)
        elif pid not in missing:
            missing[pid] = now
            actions.append(Missing(pid))
    for pid in list(missing):
        if pid not in plan_peers:  # a replan left it out: no longer ours to mourn
            del missing[pid]
    dead = [p for p, t in missing.items() if now - t > policy.replan_grace_s]

    stalled_now = stalled(plan, view.progress)
    stalled_since = {p: memory.stalled_since.get(p, now) for p in plan_peers if p in stalled_now}
    stuck = [p for p, t in stalled_since.items() if now - t > policy.stall_replan_s]

    degraded_since, degraded = _degraded(memory.degraded_since, view, now, policy)

    joiner_since = (memory.joiner_since if memory.joiner_since is not None else now) if view.joiners else None

    finish_deadline = memory.finish_deadline
    new = Memory(missing_since=missing, stalled_since=stalled_since, joiner_since=joiner_since,
                 degraded_since=degraded_since, finish_deadline=finish_deadline)

    if done(plan, view.progress):
        return new, [*actions, EndWatch("done")]
    lost = lost_blocks(plan, view.progress)
    if lost is not None:
        return new, [*actions, StateLost(tuple(lost[0]), lost[1]), EndWatch("state_lost")]

    joined = joiner_since is not None and now - joiner_since > policy.join_grace_s
    if dead or joined or stuck or degraded:
        actions += [Death(p) for p in dead]
        if stuck and not dead and not joined:
            actions.append(Stall(tuple(sorted(stuck))))
        actions += degraded
        for p in dead:
            missing.pop(p, None)
        reason: ReplanReason = "death" if dead else "join" if joined else "stall" if stuck else "link"
        start_step, state_step = restart_steps(plan, view.progress, view.live, policy.every)
        actions.append(Replan(reason, start_step, state_step, carried_resume(plan, start_step, state_step)))
        new = replace(new, missing_since=missing, stalled_since={}, degraded_since={}, joiner_since=None)

    if finish_deadline is not None and now > finish_deadline:
        return new, [*actions, EndWatch("finish_timeout")]
    if view.limit_reached:
        if finish_deadline is None:
            new = replace(new, finish_deadline=now + policy.finish_timeout_s)
        # asked again while the plan's stop is further than this (a stop request whose write failed)
        stop_at = max(max((p.step for p in view.progress.values()), default=plan.start_step) + 2, plan.start_step)
        if plan.stop_step is None or plan.stop_step > stop_at:
            actions.append(RequestStop(stop_at))
    return new, actions


#: how far past a timer's threshold :func:`next_due` wakes the shell (decide() compares with ">")
DUE_MARGIN_S = 0.05


def next_due(memory: Memory, now: float, policy: Policy) -> float | None:
    """The earliest time after ``now`` at which a timer in ``memory`` matures, or None.

    A peer missing for ``replan_grace_s``, a stall for ``stall_replan_s``, a joiner for ``join_grace_s``, a
    degraded link for ``link_replan_s``, the finish deadline: the shell's next tick comes no later than this,
    so a grace lasts what it says and not up to a whole read period more.
    """
    due = [t + policy.replan_grace_s for t in memory.missing_since.values()]
    due += [t + policy.stall_replan_s for t in memory.stalled_since.values()]
    due += [t + policy.link_replan_s for t in memory.degraded_since.values()]
    if memory.joiner_since is not None:
        due.append(memory.joiner_since + policy.join_grace_s)
    if memory.finish_deadline is not None:
        due.append(memory.finish_deadline)
    later = [t + DUE_MARGIN_S for t in due if t + DUE_MARGIN_S > now]
    return min(later, default=None)


# -- the rules, each a plain function of the plan and what the peers report ---------------------------------
def stalled(plan: JobPlan, progress: Mapping[str, ProgressRecord]) -> set[str]:
    """The plan's peers whose progress under this plan version says :attr:`PeerStatus.STALLED`."""
    return {pid for pid in plan.peers if (pr := progress.get(pid)) is not None
            and pr.plan_version == plan.version and pr.status == PeerStatus.STALLED}


def done(plan: JobPlan, progress: Mapping[str, ProgressRecord]) -> bool:
    """Every plan peer reports ``done`` under this plan version (a plan without a stop step never is)."""
    if plan.stop_step is None:
        return False
    ps = [progress.get(pid) for pid in plan.peers]
    return all(p is not None and p.plan_version == plan.version and p.status == PeerStatus.DONE for p in ps)


def lost_blocks(plan: JobPlan, progress: Mapping[str, ProgressRecord]) -> tuple[list[int], int] | None:
    """Blocks a peer of the plan found no reachable holder for, and the earliest such round; or None.

    A peer reports them in its stats: ``lost_round`` and a key ``lost:<start>-<end>`` per block range.
    """
    blocks: set[int] = set()
    rounds = []
    for pid in plan.peers:
        pr = progress.get(pid)
        if pr is None or pr.plan_version != plan.version or "lost_round" not in pr.stats:
            continue
        rounds.append(int(pr.stats["lost_round"]))
        for k in pr.stats:
            a, _, z = k[5:].partition("-")
            if k.startswith("lost:") and a.isdigit() and z.isdigit():
                blocks |= set(range(int(a), int(z)))
    return (sorted(blocks), min(rounds)) if rounds else None


def restart_steps(plan: JobPlan, progress: Mapping[str, ProgressRecord], live: Sequence[str] | frozenset[str],
                  every: int) -> tuple[int, int]:
    """Where the next plan starts: ``(start_step, state_step)``, both round boundaries.

    Every peer restarts from its group's committed global parameters, so the steps only fix the data position,
    the round schedule and the learning-rate step; any multiple of ``every`` keeps every group's rounds aligned.
    The numbering goes on from the furthest live peer of the plan (the last round boundary it reported), so it
    never goes back below the state the peers carry on from: a replan that went back would train those steps of
    the data again, step the schedule back, and number the new plan's checkpoints below the old plan's last.
    The state it may start from is as old as the slowest live peer's last boundary (``state_step``): every
    group's committed state is at least that new. Never before the plan's own start (reports of an older plan
    do not count).
    """
    members = set(plan.peers)
    steps = [p.step for pid, p in progress.items()
             if pid in live and pid in members and p.plan_version == plan.version]
    if not steps:
        return plan.start_step, plan.state_floor
    return max(plan.start_step, (max(steps) // every) * every), max(plan.start_step, (min(steps) // every) * every)


def carried_resume(plan: JobPlan, start_step: int, state_step: int) -> int | None:
    """The checkpoint step a replan still resumes from: the plan's own ``resume_step`` while the next plan
    starts at that step from that state (no live peer reported a round committed since the resume), else None.

    A peer that holds nothing of the job (new, or planned now in place of one that died) then asks for that
    step's state, which holders answer from their state directories; without it it would ask only for what
    peers hold in memory, and nobody holds anything in memory before the resumed job's first round. (Seen when
    a swarm restarted within a liveness period of the crash: plan v1 of the resume took the dead peers'
    records for live peers, and the replan around them found "no reachable holder" on live holders' disks.)
    """
    if plan.resume_step is not None and start_step == state_step == plan.resume_step:
        return plan.resume_step
    return None


def _degraded(since: Mapping[Link, float], view: View, now: float,
              policy: Policy) -> tuple[dict[Link, float], list[LinkDegraded]]:
    """The plan's hop directions measured below ``link_degraded_ratio`` of their assumed figure, and for how long.

    Each receiving peer reports the links into it that held its messages (``ProgressRecord.links_in``). A
    report that the link keeps up, or none from a peer whose record was read, ends a degradation; a record
    missed by one read does not.
    """
    ratio = policy.link_degraded_ratio
    if ratio <= 0:
        return {}, []
    out: dict[Link, float] = {}
    found: list[LinkDegraded] = []
    for (src, dst), assumed in view.assumed.items():
        pr = view.progress.get(dst)
        if pr is None:
            if (src, dst) in since:
                out[(src, dst)] = since[(src, dst)]
            continue
        rep = pr.links_in.get(src)
        if rep is None or rep.bandwidth_bps >= ratio * assumed:
            continue
        out[(src, dst)] = t = since.get((src, dst), now)
        if now - t >= policy.link_replan_s:
            found.append(LinkDegraded(src, dst, round(rep.bandwidth_bps, 1), round(assumed, 1), rep.queued,
                                      rep.messages))
    return out, found
