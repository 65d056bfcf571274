"""One round of a stage group: a hierarchical, deadline-bounded all-reduce with one commit point.

Phases (roles from :class:`~geotrain.sync.membership.RoundRoles`; all times are
fractions of the round deadline ``D``, from each member's own start)::

    1 gather     member -> its region leader        pseudo-gradient (intra codec, error feedback)   0.30 D
    2 offer      leader -> coordinator              which members' vectors the leader holds        0.45 D
    3 decide     coordinator -> every leader        the counted region groups, or "discard"        0.60 D
    4 scatter    leader -> shard owner j            shard j of the region's sum (cross codec, EF)  0.80 D
    5 gather     owner j -> every leader            the aggregated shard j (cross codec, EF)       1.00 D
    6 return     leader -> its region's members     every owner's encoded shard, forwarded as-is   1.10 D

Only phases 4 and 5 cross regions, between one leader per region: each WAN
link carries its shard of the fragment, O(size / ratio) per region per round.

**Who agrees on what.** The coordinator alone decides the contributor set
(phase 3): a region group whose leader's offer missed the deadline, a member
whose vector missed its leader's deadline, and a member whose vector is
NaN/Inf or of absurd norm (named in the log and in ``excluded``) are left out,
and the mean is re-normalised over those counted. With fewer than
``quorum`` of the round's members counted, the decision is "discard".

**The commit point.** A member commits round ``r`` exactly when it holds the
whole decision-stamped result (every shard). Everyone who commits applies the
same bytes: every shard is decoded from the one encoding its owner made (the
owner uses the decoded value too), and leaders forward those encodings
unchanged to their region, where each member decodes them itself. Then the outer optimizer runs identically everywhere.

**Failures (torchft-style, written down).** A member missing a message waits
until its phase deadline, then asks the other members (``sync.ask``) for the
definitive outcome until ``2 D``; a member answers only with what is final:
"committed" with the result, or "discarded" by the coordinator.

- a member dies before phase 1: its vector is missing; the round goes on without it;
- a leader dies: its region group is not counted; its region's members notice
  at once (their ``sync.ping`` goes unanswered), learn the result by asking, and
  keep their own progress (see below); one that dies or freezes right after it
  committed is noticed while they wait for its result (they ping it again
  every ``min(1 s, 0.1 D)``), so they learn the result seconds after the
  other regions, not at 1.1 D;
- the coordinator dies before deciding: no decision exists, nobody commits,
  every member asks in vain and discards the round at ``2 D``;
- a shard owner dies before sending its shard to anyone: nobody holds the whole
  result, nobody commits, the round is discarded everywhere; if it reached at
  least one leader, the others fetch the result by asking;
- the only way to diverge: every member that committed becomes unreachable to
  one that did not for the whole ``2 D``. That member logs it, and its global
  copy must then be refreshed by state transfer (``state_dict`` of a member).

Rounds have no barrier: a member that starts a round more than 0.3 D after
its leader (or whose leader's offer reaches the coordinator after 0.45 D) is
not counted, but still applies the result; it is counted again once it keeps
pace. A coordinator that starts late is waited for: a leader without a
decision at 0.6 D whose coordinator answers a ``sync.ping`` waits for it until
1.0 D and then runs its later phases as if the decision had come at 0.45 D,
so a coordinator up to 0.7 D behind its leaders (1.0 D less its own gather,
at most 0.3 D) still gets the round committed; such a round ends by 2.55 D.
With a DHT-backed membership a dead peer leaves the member list when its
heartbeat expires, so it stops costing rounds.

A discarded round changes nothing: local parameters, global copy, outer
momentum and error-feedback residuals stay as they were, so the local progress
goes into the next round's pseudo-gradient. A member not counted in a committed
round applies the outer step too (to stay identical) and keeps its own
uncounted progress on top of it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from geotrain.errors import (
    BadContributionError,
    CodecError,
    ConfigError,
    PeerTimeoutError,
    RoundAbortedError,
    TransportError,
)
from geotrain.sync.aggregate import Contribution, aggregate, check_contribution, screen
from geotrain.sync.config import DiLoCoConfig
from geotrain.sync.membership import Membership, RoundId, RoundRoles
from geotrain.sync.payload import CARRIER, decode_payload, encode_payload
from geotrain.transport import Message, Transport

__all__ = ["GroupRouter", "RoundOutcome", "RoundRunner", "RoundStatus", "SyncStats"]

logger = logging.getLogger(__name__)

# how long a leader waits for the decision of a coordinator that answers but started the round late, as a
# fraction of D from the leader's own start (see "Rounds have no barrier" above)
LATE_DECISION = 1.0
KINDS = ("sync.contrib", "sync.offer", "sync.decide", "sync.shard", "sync.result", "sync.final")


class RoundStatus(str, Enum):  # noqa: UP042 (StrEnum needs Python 3.11; geotrain supports 3.10)
    """What a member knows of one round's fate (the value is what ``sync.final``/``sync.answer`` carry).

    - ``committed``: this member holds the whole decision-stamped result; it applies it (the commit point);
    - ``discarded``: definitive, nobody commits: the coordinator decided so (quorum lost), or a shard can
      never exist (its owner, or a leader it needs, could not encode; see :class:`RoundAbortedError`);
    - ``unknown``: not known here yet (no decision, a shard missing): the member asks the others;
    - ``abandoned``: asked until ``2 D`` in vain: discarded on this member only (others may have committed:
      its global copy then needs a state transfer);
    - ``aborted``: this member could not take part (not a member of the round, its own transport closed).

    Only ``committed`` changes anything; every other outcome leaves parameters, momentum and residuals as
    they were.
    """

    COMMITTED = "committed"
    DISCARDED = "discarded"
    UNKNOWN = "unknown"
    ABANDONED = "abandoned"
    ABORTED = "aborted"


@dataclass
class RoundOutcome:
    """What one member learnt from one round. ``delta`` is the group's pseudo-gradient ``(N,)`` when committed."""

    round_id: RoundId
    status: RoundStatus
    delta: torch.Tensor | None = None
    contributors: tuple[str, ...] = ()
    excluded: dict[str, str] = field(default_factory=dict)
    reason: str = ""
    seconds: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.status, RoundStatus):
            raise TypeError(f"RoundOutcome.status must be a RoundStatus; got {self.status!r}")
        if self.committed != (self.delta is not None):
            raise ValueError("a committed round outcome carries its delta, and only a committed one")

    @property
    def committed(self) -> bool:
        """Whether this member applies the round's result."""
        return self.status is RoundStatus.COMMITTED

    @property
    def definitive(self) -> bool:
        """Committed or discarded for every member: what this member may answer others' ``sync.ask`` with."""
        return self.status in (RoundStatus.COMMITTED, RoundStatus.DISCARDED)


@dataclass
class SyncStats:
    """Bytes this peer handed to the data plane for rounds, split by whether they left its region; rounds
    run and their wall seconds (from this member's start to its outcome); seconds the inner loop waited
    for a round's result (all of every round with ``overlap = 0``; only the late part otherwise)."""

    bytes_intra: int = 0
    bytes_cross: int = 0
    rounds_committed: int = 0
    rounds_discarded: int = 0
    round_s: float = 0.0
    wait_s: float = 0.0


class GroupRouter:
    """The round-control requests of one transport, for every stage group it carries.

    It serves ``sync.ping`` (is this peer's data plane up? a member asks its round
    leader) and ``sync.ask`` (what became of a round? routed to the runner of the
    stage group the request names). A transport serves each kind once, so one
    router per transport, registered once and held by an explicit owner: the peer
    agent (from its start, so a member's ping is answered before any runner
    exists), or a :class:`RoundRunner` built without one, which then closes it with
    itself. Runners :meth:`add` their group when built and :meth:`remove` it when
    closed, so a closed runner is not kept alive by the transport.

    Thread ownership: ``_groups`` is guarded by ``_lock``; requests arrive on the
    transport's handler pool while runners come and go on the agent's thread.
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self._lock = threading.Lock()
        self._groups: dict[str, Callable[[Message], Message]] = {}
        transport.serve("sync.ping", lambda req: Message("sync.pong"))
        try:
            transport.serve("sync.ask", self._dispatch)
        except TransportError:
            transport.unserve("sync.ping")
            raise

    def add(self, group: str, answer: Callable[[Message], Message]) -> None:
        """Route ``sync.ask`` for ``group`` to ``answer``; a group has one runner per transport."""
        with self._lock:
            if group in self._groups:
                raise ConfigError(f"stage group {group!r} already has a round runner on this transport")
            self._groups[group] = answer

    def remove(self, group: str, answer: Callable[[Message], Message] | None = None) -> None:
        """Forget ``group`` (only if it is still routed to ``answer``, when given: a newer runner stays)."""
        with self._lock:
            if answer is None or self._groups.get(group) == answer:
                self._groups.pop(group, None)

    @property
    def groups(self) -> list[str]:
        with self._lock:
            return sorted(self._groups)

    def close(self) -> None:
        """Stop serving both kinds on the transport; every group is forgotten."""
        with self._lock:
            self._groups.clear()
        self.transport.unserve("sync.ask")
        self.transport.unserve("sync.ping")

    def _dispatch(self, req: Message) -> Message:
        with self._lock:
            handler = self._groups.get(str(req.meta.get("group")))
        return handler(req) if handler is not None else Message("sync.answer", meta={"status": RoundStatus.UNKNOWN.value})


class RoundRunner:
    """Runs rounds for one member (thread-safe: one thread per fragment may call :meth:`run`).

    Thread ownership: ``_lock`` guards ``stats``, ``_final`` (read by ``sync.ask`` on the transport's
    handler pool) and the ``_residual`` dict (fragments' round threads insert into it); each residual
    tensor is only read and written by the round thread of its own fragment.

    ``router``: the transport's :class:`GroupRouter` (shared by every group on it); without one the runner
    makes its own, which then means no other group may take rounds on this transport. :meth:`close`
    unregisters the group.
    """

    def __init__(
        self,
        config: DiLoCoConfig,
        *,
        transport: Transport,
        membership: Membership,
        numels: Sequence[int],
        clock: Callable[[], float] = time.monotonic,
        router: GroupRouter | None = None,
    ) -> None:
        self.config = config
        self.transport = transport
        self.membership = membership
        self.me = transport.peer_id
        self.clock = clock
        self.numels = list(numels)
        self.stats = SyncStats()
        self._lock = threading.Lock()
        self._context = ("", 0)
        # error-feedback residuals per fragment: what this peer sent as a member, leader and owner
        self._residual: dict[tuple[str, int], torch.Tensor] = {}
        self._final: dict[tuple[int, int], RoundOutcome] = {}  # definitive outcomes, for sync.ask
        self._regions: dict[str, str] = {}
        self._owns_router = router is None
        self.router = router if router is not None else GroupRouter(transport)
        try:
            self.router.add(config.group, self._answer)
        except ConfigError:
            if self._owns_router:
                self.router.close()
            raise

    def close(self) -> None:
        """Stop answering for this group (and close the router when this runner made it). Idempotent."""
        self.router.remove(self.config.group, self._answer)
        if self._owns_router:
            self.router.close()

    def set_context(self, *, job: str, plan_version: int) -> None:
        """Stamp outbound round messages so receivers with a transport context keep them."""
        self._context = (job, plan_version)

    # -- entry point -------------------------------------------------------------------------------
    def add_wait(self, seconds: float) -> None:
        """Count ``seconds`` the inner loop spent waiting for a round's result."""
        with self._lock:
            self.stats.wait_s += seconds

    def run(self, round_id: RoundId, pseudo_grad: torch.Tensor) -> RoundOutcome:
        """Take part in ``round_id`` with this member's pseudo-gradient ``(N,)``; never raises on peers' faults."""
        t0 = self.clock()
        members = list(self.membership.members(round_id))
        if not any(m.peer_id == self.me for m in members):
            return RoundOutcome(round_id, RoundStatus.ABORTED, reason=f"{self.me} is not a member of this round")
        roles = RoundRoles.build(members, round_id, hierarchical=self.config.hierarchical)
        for m in members:
            self._regions[m.peer_id] = m.region
            if m.peer_id != self.me:
                self.transport.connect(m.peer_id, m.address, region=m.region)
        n = self.numels[round_id.fragment]
        deadline = self.config.deadline_s(8 * n)
        with self._lock:  # other fragments' round threads insert their residuals meanwhile
            saved = {k: v.clone() for k, v in self._residual.items() if k[1] == round_id.fragment}
        job = _Round(self, round_id, roles, pseudo_grad.reshape(-1).float(), n, t0, deadline)
        try:
            outcome = job.run()
        except TransportError as e:  # our own endpoint failed (closed): the round cannot finish here
            outcome = RoundOutcome(round_id, RoundStatus.ABORTED, reason=f"transport failed: {e}")
        outcome.seconds = self.clock() - t0
        counted = outcome.committed and self.me in outcome.contributors
        with self._lock:
            if not counted:
                # what we encoded was not applied (as sent): the residuals must not pretend it was
                for k, v in saved.items():
                    if not outcome.committed or k[0] != "owner":
                        self._residual[k] = v
            self.stats.round_s += outcome.seconds
            if outcome.committed:
                self.stats.rounds_committed += 1
            else:
                self.stats.rounds_discarded += 1
        group, frag, number = self.config.group, round_id.fragment, round_id.number

        def stale(tag: tuple[Any, ...]) -> bool:
            return len(tag) >= 3 and tag[0] == group and tag[1] == frag and isinstance(tag[2], int) and tag[2] <= number

        for kind in KINDS:  # late traffic of this and older rounds would only pile up
            self.transport.discard(kind, stale)
        return outcome

    # -- checkpoints: the error-feedback residuals ------------------------------------------------------
    def export_residuals(self) -> dict[tuple[str, int], torch.Tensor]:
        """Copies of this member's error-feedback residuals, by (role, fragment), for a checkpoint.

        A residual is this member's own (what its codec dropped as a member, leader or owner), not the
        group's: it belongs in this peer's checkpoint only. Call it between rounds (the step thread, after
        the boundary's rounds applied); a fragment whose round is still in flight (``sync.overlap > 0``)
        is read as it stands.
        """
        with self._lock:
            return {k: v.clone() for k, v in self._residual.items()}

    def import_residuals(self, residuals: dict[tuple[str, int], torch.Tensor]) -> None:
        """Adopt residuals :meth:`export_residuals` wrote (before any round runs); a shape that does not fit
        this group's fragments is a ConfigError and nothing is adopted."""
        for (role, frag), t in residuals.items():
            if not 0 <= frag < len(self.numels) or t.numel() != self.numels[frag]:
                raise ConfigError(f"residual {role}/{frag} of {t.numel()} values does not fit this group's "
                                  f"fragments ({self.numels})")
        with self._lock:
            self._residual = {k: t.detach().reshape(-1).float().clone() for k, t in residuals.items()}

    # -- helpers used by _Round ----------------------------------------------------------------------
    def residual(self, role: str, fragment: int) -> torch.Tensor | None:
        if not self.config.error_feedback:
            return None
        key = (role, fragment)
        with self._lock:  # one fragment's tensors are only touched by that fragment's round thread
            if key not in self._residual:
                self._residual[key] = torch.zeros(self.numels[fragment])
            return self._residual[key]

    def send(self, peer: str, msg: Message, deadline: float) -> None:
        msg.job, msg.plan_version = self._context
        cross = self._regions.get(peer) != self._regions.get(self.me)
        try:
            fut = self.transport.send_async(peer, msg, codec=CARRIER, timeout=max(0.05, deadline - self.clock()))
        except TransportError as e:
            logger.debug("send of %s to %s failed: %s", msg.kind, peer, e)
            return
        fut.add_done_callback(lambda f: self._count(f, cross))

    def _count(self, fut: concurrent.futures.Future[int], cross: bool) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        with self._lock:
            if cross:
                self.stats.bytes_cross += fut.result()
            else:
                self.stats.bytes_intra += fut.result()

    def collect(self, kind: str, tag: tuple[Any, ...], expected: set[str], deadline: float) -> dict[str, Message]:
        """Messages of ``kind``/``tag`` from ``expected`` senders (one each) until all came or ``deadline``."""
        got: dict[str, Message] = {}
        while expected - got.keys():
            # past the deadline (this process was frozen or starved): still take what already arrived
            left = max(0.0, deadline - self.clock())
            try:
                msg = self.transport.recv(kind, tag, timeout=left)
            except PeerTimeoutError:
                break
            if msg.sender in expected and msg.sender not in got:
                got[msg.sender] = msg
        return got

    def alive(self, peer: str, *, timeout: float) -> bool:
        """Whether ``peer``'s endpoint answers a ``sync.ping`` within ``timeout``."""
        try:
            self.transport.request(peer, Message("sync.ping"), timeout=timeout)
        except (PeerTimeoutError, TransportError):
            return False
        return True

    def publish(self, outcome: RoundOutcome) -> None:
        with self._lock:
            self._final[(outcome.round_id.fragment, outcome.round_id.number)] = outcome
            for key in sorted(self._final)[: max(0, len(self._final) - 4 * max(1, len(self.numels)))]:
                del self._final[key]

    def _answer(self, req: Message) -> Message:
        frag, number = req.meta.get("fragment"), req.meta.get("number")
        with self._lock:
            outcome = self._final.get((frag, number)) if isinstance(frag, int) and isinstance(number, int) else None
        if outcome is None or not outcome.definitive:
            return Message("sync.answer", meta={"status": RoundStatus.UNKNOWN.value})
        if not outcome.committed:
            return Message("sync.answer", meta={"status": RoundStatus.DISCARDED.value, "reason": outcome.reason})
        assert outcome.delta is not None
        return Message(
            "sync.answer",
            meta={"status": RoundStatus.COMMITTED.value, "contributors": list(outcome.contributors)},
            tensors={"delta": outcome.delta},
        )

    def ask(self, round_id: RoundId, roles: RoundRoles, n: int, until: float) -> RoundOutcome | None:
        """Ask the other members for the definitive outcome of ``round_id`` until ``until``."""
        order = [roles.coordinator] + [m for m in roles.leaders.values()] + list(roles.all_members)
        peers = list(dict.fromkeys(m.peer_id for m in order if m.peer_id != self.me))
        meta = {"group": self.config.group, "fragment": round_id.fragment, "number": round_id.number}
        passes = 0
        while passes == 0 or self.clock() < until:
            passes += 1
            for peer in peers:
                # a member that wakes up past ``until`` (frozen, starved) still asks everyone once, briefly
                left = max(until - self.clock(), 0.5 if passes == 1 else 0.0)
                if left <= 0:
                    break
                try:
                    reply = self.transport.request(peer, Message("sync.ask", meta=meta), timeout=min(1.0, left))
                except (PeerTimeoutError, TransportError):
                    continue
                status = _wire_status(reply.meta.get("status"))
                if status is RoundStatus.DISCARDED:
                    return RoundOutcome(round_id, status, reason=f"discarded (learnt from {peer})")
                delta = reply.tensors.get("delta")
                contributors = reply.meta.get("contributors")
                if (status is RoundStatus.COMMITTED and delta is not None and delta.numel() == n
                        and isinstance(contributors, list)):
                    return RoundOutcome(round_id, status, delta.reshape(-1).float(), tuple(map(str, contributors)))
            # everyone is still at work or gone: wait a little before the next pass
            threading.Event().wait(min(0.2, max(0.0, until - self.clock())))
        return None


class _Round:
    """The state machine of one round on one member (see the module docstring)."""

    def __init__(
        self, runner: RoundRunner, rid: RoundId, roles: RoundRoles, pg: torch.Tensor, n: int, t0: float, d: float
    ) -> None:
        self.r, self.rid, self.roles, self.pg, self.n, self.t0, self.d = runner, rid, roles, pg, n, t0, d
        self.config = runner.config
        self.me = runner.me
        self.tag = (self.config.group, rid.fragment, rid.number)
        self.group = roles.group_of(self.me)
        self.leader = roles.leaders[self.group]
        self._my_shard = torch.empty(0)
        self._my_encoded: tuple[Any, dict[str, torch.Tensor]] = ({}, {})
        self.encoded: list[tuple[Any, dict[str, torch.Tensor]]] = []

    def at(self, fraction: float) -> float:
        return self.t0 + fraction * self.d

    def run(self) -> RoundOutcome:
        try:
            check_contribution(self.pg, sender=self.me, config=self.config)
            own_ok, own_reason = True, ""
        except BadContributionError as e:
            logger.error("own %s", e)
            own_ok, own_reason = False, str(e)
        if self.leader.peer_id != self.me:
            return self.run_member(own_ok, own_reason)
        return self.run_leader(own_ok, own_reason)

    # -- plain member ------------------------------------------------------------------------------
    def run_member(self, own_ok: bool, own_reason: str) -> RoundOutcome:
        meta: dict[str, Any] = {}
        tensors: dict[str, torch.Tensor] = {}
        if own_ok:
            try:
                residual = self.r.residual("member", self.rid.fragment)
                entry, tensors, _ = encode_payload(self.pg, self.config.intra_codec, prefix="p", residual=residual)
                meta["payload"] = entry
            except CodecError as e:
                own_ok, own_reason = False, f"cannot encode own pseudo-gradient: {e}"
        if not own_ok:
            meta = {"abstain": own_reason[:512]}
        self.r.send(self.leader.peer_id, Message("sync.contrib", self.tag, meta=meta, tensors=tensors), self.at(0.3))
        # a dead leader would cost us the whole 1.1 D wait and leave us late for the next round: probe it, and
        # again while we wait (one frozen or killed right after it committed never sends us the result while
        # the other regions have it: waiting out 1.1 D put this region that far behind them, and a skew past
        # 0.7 D loses every later round, since each member times its round from its own start)
        leader, probe = self.leader.peer_id, min(1.0, 0.1 * self.d)
        got: dict[str, Message] = {}
        if self.r.alive(leader, timeout=probe):
            while not got and self.r.clock() < self.at(1.1):
                got = self.r.collect("sync.final", self.tag, {leader}, min(self.at(1.1), self.r.clock() + 2 * probe))
                if not got and self.r.clock() < self.at(1.1) and not self.r.alive(leader, timeout=probe):
                    logger.warning("leader %s of round %s stopped answering; asking the others", leader, self.rid)
                    break
        else:
            logger.warning("leader %s of round %s does not answer; asking the others", leader, self.rid)
        msg = got.get(leader)
        if msg is not None:
            outcome = self._read_final(msg)
            if outcome is not None:
                return outcome
        return self._ask()

    def _read_final(self, msg: Message) -> RoundOutcome | None:
        status = _wire_status(msg.meta.get("status"))
        if status is RoundStatus.DISCARDED:
            outcome = RoundOutcome(self.rid, status, reason=str(msg.meta.get("reason", "discarded")))
            self.r.publish(outcome)
            return outcome
        contributors, entries = msg.meta.get("contributors"), msg.meta.get("shards")
        if status is RoundStatus.COMMITTED and isinstance(contributors, list) and isinstance(entries, list) and entries:
            # decode the owners' very encodings, as our leader did: the same bytes give the same bits
            bounds = _shard_bounds(self.n, len(entries))
            try:
                delta = torch.cat([
                    decode_payload(e, msg.tensors, prefix=f"s{j}", sender=msg.sender, numel=hi - lo)
                    for j, (e, (lo, hi)) in enumerate(zip(entries, bounds, strict=True))
                ])
            except BadContributionError as e:
                logger.warning("%s", e)
                return None
            raw = msg.meta.get("excluded")
            excluded = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
            outcome = RoundOutcome(self.rid, RoundStatus.COMMITTED, delta, tuple(map(str, contributors)), excluded)
            self.r.publish(outcome)
            return outcome
        return None

    def _ask(self) -> RoundOutcome:
        outcome = self.r.ask(self.rid, self.roles, self.n, self.at(2.0))
        if outcome is None:
            msg = f"round {self.rid} discarded here: no member held its outcome within {2 * self.d:.1f}s"
            logger.warning("%s (if others committed, this member needs a state transfer)", msg)
            return RoundOutcome(self.rid, RoundStatus.ABANDONED, reason=msg)
        if outcome.committed:
            self.r.publish(outcome)
        return outcome

    # -- region leader ------------------------------------------------------------------------------
    def run_leader(self, own_ok: bool, own_reason: str) -> RoundOutcome:
        region_members = self.roles.members_of(self.group)
        others = {m.peer_id for m in region_members} - {self.me}
        values: dict[str, torch.Tensor] = {self.me: self.pg} if own_ok else {}
        excluded: dict[str, str] = {} if own_ok else {self.me: own_reason}
        got = self.r.collect("sync.contrib", self.tag, others, self.at(0.3))
        for peer in sorted(others):
            msg = got.get(peer)
            if msg is None:
                excluded[peer] = f"{peer} missed the gather deadline"
            elif "abstain" in msg.meta:
                excluded[peer] = f"{peer} abstained: {str(msg.meta['abstain'])[:200]}"
            else:
                try:
                    values[peer] = decode_payload(msg.meta.get("payload"), msg.tensors, prefix="p", sender=peer, numel=self.n)
                except BadContributionError as e:
                    logger.warning("%s", e)
                    excluded[peer] = str(e)
        accepted, bad = screen(values, config=self.config)
        excluded.update(bad)
        outcome = self.run_cross(accepted, excluded)
        if outcome.definitive:
            self.r.publish(outcome)
        for peer in sorted(others):
            if outcome.committed:
                assert outcome.delta is not None
                meta = {"status": RoundStatus.COMMITTED.value, "contributors": list(outcome.contributors),
                        "excluded": outcome.excluded, "shards": [entry for entry, _ in self.encoded]}
                tensors = {f"s{j}.{k.split('.', 1)[1]}": t for j, (_, ts) in enumerate(self.encoded) for k, t in ts.items()}
                msg = Message("sync.final", self.tag, meta=meta, tensors=tensors)
            elif outcome.status is RoundStatus.DISCARDED:
                msg = Message("sync.final", self.tag, meta={"status": RoundStatus.DISCARDED.value,
                                                            "reason": outcome.reason})
            else:
                msg = Message("sync.final", self.tag, meta={"status": RoundStatus.UNKNOWN.value})
            self.r.send(peer, msg, self.at(1.1))
        if not outcome.definitive:
            asked = self._ask()
            asked.excluded = {**excluded, **asked.excluded}
            return asked
        return outcome

    def run_cross(self, accepted: dict[str, torch.Tensor], excluded: dict[str, str]) -> RoundOutcome:
        """Phases 2-5 from this leader's side; returns committed, discarded (by the decision, or because this
        leader could not encode a shard: :class:`RoundAbortedError`), or unknown."""
        coordinator = self.roles.coordinator.peer_id
        offer = {"members": sorted(accepted), "excluded": excluded}
        decision: dict[str, Any] | None
        if coordinator == self.me:
            decision = self.decide(offer)
        else:
            self.r.send(coordinator, Message("sync.offer", self.tag, meta=offer), self.at(0.45))
            got = self.r.collect("sync.decide", self.tag, {coordinator}, self.at(0.6))
            if coordinator not in got and self.r.alive(coordinator, timeout=min(1.0, 0.1 * self.d)):
                # up, but it has not decided: it began this round later than we did (rounds have no barrier;
                # a member slower between rounds, or one that learnt the last round by asking, starts late).
                # Giving up now would lose the round everywhere: it would count our offer and wait for our
                # shard. Wait on, and run our later phases on its schedule.
                got = self.r.collect("sync.decide", self.tag, {coordinator}, self.at(LATE_DECISION))
                if coordinator in got:
                    self.t0 = max(self.t0, self.r.clock() - 0.45 * self.d)
            decision = got[coordinator].meta if coordinator in got else None
        if decision is None:
            return RoundOutcome(self.rid, RoundStatus.UNKNOWN, excluded=excluded, reason="no decision from the coordinator")
        groups = decision.get("groups")
        if decision.get("discard") or not isinstance(groups, dict) or not groups:
            return RoundOutcome(
                self.rid, RoundStatus.DISCARDED, excluded=excluded,
                reason=f"discarded by the coordinator: {str(decision.get('reason', ''))[:300]}",
            )
        keys = sorted(k for k in groups if k in self.roles.leaders)
        counted: dict[str, list[str]] = {k: [str(p) for p in groups[k]] for k in keys}
        owners = [self.roles.leaders[k].peer_id for k in keys]
        bounds = _shard_bounds(self.n, len(owners))
        mine = self.group in counted
        if mine and counted[self.group] != sorted(accepted):
            # the coordinator counted what we offered; anything else means a confused peer: do not mix
            return RoundOutcome(self.rid, RoundStatus.UNKNOWN, excluded=excluded,
                                reason="decision disagrees with our offer")
        local = self.local_contributions(accepted) if mine else []
        try:
            for j, owner in enumerate(owners):
                if mine and owner != self.me:
                    self.send_shard(owner, j, bounds[j], local)
            if self.me in owners:
                j = owners.index(self.me)
                self.own_shard(j, bounds[j], keys, counted, local)
        except RoundAbortedError as e:
            # without our shard (or our region's part of one) nobody can hold the whole result: discarded
            # everywhere. Owners waiting on us are told at once (empty shard / failed result), not at deadline
            logger.warning("round %s: %s", self.rid, e)
            if self.me in owners:
                self.fail_result()
            return RoundOutcome(self.rid, RoundStatus.DISCARDED, excluded=excluded, reason=str(e))
        got = self.r.collect("sync.result", self.tag, set(owners) - {self.me}, self.at(1.0))
        shards: list[torch.Tensor] = []
        self.encoded = []  # (entry, buffers) of every shard, forwarded as-is to our region
        for j, owner in enumerate(owners):
            lo, hi = bounds[j]
            if owner == self.me:
                if self._my_shard.numel() != hi - lo:
                    return RoundOutcome(self.rid, RoundStatus.UNKNOWN, excluded=excluded,
                                        reason=f"own shard {j} incomplete")
                shards.append(self._my_shard)
                self.encoded.append(self._my_encoded)
                continue
            msg = got.get(owner)
            if msg is None or msg.meta.get("status") != "ok":
                return RoundOutcome(self.rid, RoundStatus.UNKNOWN, excluded=excluded,
                                    reason=f"shard {j} from {owner} missing")
            try:
                shards.append(decode_payload(msg.meta.get("payload"), msg.tensors, prefix="r", sender=owner, numel=hi - lo))
                self.encoded.append((msg.meta["payload"], {k: t for k, t in msg.tensors.items() if k.startswith("r.")}))
            except BadContributionError as e:
                return RoundOutcome(self.rid, RoundStatus.UNKNOWN, excluded=excluded, reason=str(e))
        contributors = tuple(sorted(p for ps in counted.values() for p in ps))
        all_excluded = {**excluded, **{str(k): str(v) for k, v in dict(decision.get("excluded", {})).items()}}
        return RoundOutcome(self.rid, RoundStatus.COMMITTED, torch.cat(shards), contributors, all_excluded)

    def decide(self, own_offer: dict[str, Any]) -> dict[str, Any]:
        """Coordinator: collect offers, pick the counted groups (or discard), tell every leader."""
        leaders = {key: m.peer_id for key, m in self.roles.leaders.items()}
        others = set(leaders.values()) - {self.me}
        got = self.r.collect("sync.offer", self.tag, others, self.at(0.45))
        by_peer = {leader: key for key, leader in leaders.items()}
        offers = {self.group: own_offer} | {by_peer[p]: m.meta for p, m in got.items()}
        groups: dict[str, list[str]] = {}
        excluded: dict[str, str] = {}
        for key in sorted(leaders):
            offer = offers.get(key)
            group_ids = {m.peer_id for m in self.roles.members_of(key)}
            members = offer.get("members") if offer is not None else None
            if offer is None:
                for p in sorted(group_ids):
                    excluded[p] = f"region group {key} (leader {leaders[key]}) missed the offer deadline"
                continue
            if not isinstance(members, list) or not set(members) <= group_ids:
                excluded[leaders[key]] = f"leader {leaders[key]} offered members outside its group"
                continue
            if members:
                groups[key] = sorted(str(p) for p in members)
            if isinstance(offer.get("excluded"), dict):
                excluded.update({str(k): str(v)[:300] for k, v in offer["excluded"].items()})
        total = len(self.roles.all_members)
        counted = sum(len(v) for v in groups.values())
        need = max(1, math.ceil(self.config.quorum * total))
        decision: dict[str, Any]
        if counted < need:
            reason = f"{counted} of {total} members counted, quorum needs {need}"
            logger.warning("round %s discarded: %s", self.rid, reason)
            decision = {"discard": True, "reason": reason}
        else:
            decision = {"groups": groups, "excluded": excluded}
        for peer in sorted(others):
            self.r.send(peer, Message("sync.decide", self.tag, meta=decision), self.at(0.6))
        return decision

    def local_contributions(self, accepted: dict[str, torch.Tensor]) -> list[Contribution]:
        if self.config.aggregation == "mean":
            total = torch.zeros(self.n, dtype=torch.float64)
            for peer in sorted(accepted):
                total += accepted[peer].double()
            return [Contribution(total.float(), tuple(sorted(accepted)))]
        return [Contribution(accepted[p], (p,)) for p in sorted(accepted)]

    def send_shard(self, owner: str, j: int, bound: tuple[int, int], local: list[Contribution]) -> None:
        """Our region's part of shard ``j`` to its owner; raises :class:`RoundAbortedError` when it cannot be
        encoded (the owner is sent an empty shard, so it gives up at once)."""
        lo, hi = bound
        entries, tensors = [], {}
        try:
            for i, c in enumerate(local):
                # error feedback only on our own region sum; forwarded single vectors are not ours to bias
                res = self.r.residual("leader", self.rid.fragment) if len(local) == 1 else None
                entry, ts, _ = encode_payload(
                    c.value[lo:hi], self.config.cross_codec, prefix=f"c{i}", residual=None if res is None else res[lo:hi]
                )
                entries.append({**entry, "members": list(c.members)})
                tensors.update(ts)
        except CodecError as e:
            self.r.send(owner, Message("sync.shard", (*self.tag, j), meta={"payloads": []}), self.at(0.8))
            raise RoundAbortedError(f"cannot encode our part of shard {j} for {owner}: {e}") from e
        self.r.send(owner, Message("sync.shard", (*self.tag, j), meta={"payloads": entries}, tensors=tensors), self.at(0.8))

    def fail_result(self) -> None:
        """Shard owner: tell every other leader our shard will not come (they stop waiting for it)."""
        for peer in sorted({m.peer_id for m in self.roles.leaders.values()} - {self.me}):
            self.r.send(peer, Message("sync.result", self.tag, meta={"status": "failed"}), self.at(1.0))
        self._my_shard = torch.empty(0)

    def own_shard(
        self, j: int, bound: tuple[int, int], keys: list[str], counted: dict[str, list[str]], local: list[Contribution]
    ) -> None:
        """Shard owner: aggregate shard ``j`` over the counted groups, send it to every leader."""
        lo, hi = bound
        senders = {self.roles.leaders[k].peer_id: k for k in keys if k != self.group}
        got = self.r.collect("sync.shard", (*self.tag, j), set(senders), self.at(0.8))
        contributions: list[Contribution] = [Contribution(c.value[lo:hi], c.members) for c in local]
        ok = True
        for peer, key in sorted(senders.items(), key=lambda kv: kv[1]):
            msg = got.get(peer)
            entries = msg.meta.get("payloads") if msg is not None else None
            if not isinstance(entries, list) or not entries:
                ok = False
                break
            assert msg is not None
            theirs: list[Contribution] = []
            try:
                for i, entry in enumerate(entries):
                    members = entry.get("members") if isinstance(entry, dict) else None
                    if not isinstance(members, list) or not members:
                        raise BadContributionError(f"shard from {peer} lacks its member list", sender=peer)
                    value = decode_payload(entry, msg.tensors, prefix=f"c{i}", sender=peer, numel=hi - lo)
                    if not bool(torch.isfinite(value).all()):
                        raise BadContributionError(f"shard from leader {peer} holds NaN/Inf", sender=peer)
                    theirs.append(Contribution(value, tuple(str(p) for p in members)))
            except BadContributionError as e:
                logger.warning("%s", e)
                ok = False
                break
            if sorted(p for c in theirs for p in c.members) != counted[key]:
                logger.warning("shard from %s covers other members than the decision counted", peer)
                ok = False
                break
            contributions.extend(theirs)
        leaders = sorted({m.peer_id for m in self.roles.leaders.values()} - {self.me})
        if not ok:
            self.fail_result()
            return
        contributions.sort(key=lambda c: c.members)
        agg = aggregate(contributions, config=self.config)  # (hi - lo,)
        res = self.r.residual("owner", self.rid.fragment)
        try:
            entry, tensors, decoded = encode_payload(
                agg, self.config.cross_codec, prefix="r", residual=None if res is None else res[lo:hi]
            )
        except CodecError as e:
            raise RoundAbortedError(f"cannot encode aggregated shard {j}: {e}") from e
        self._my_shard = decoded
        self._my_encoded = (entry, tensors)
        for peer in leaders:
            self.r.send(peer, Message("sync.result", self.tag, meta={"status": "ok", "payload": entry}, tensors=tensors),
                        self.at(1.0))


def _wire_status(value: Any) -> RoundStatus:
    """A round status as a peer sent it; anything unrecognised counts as not known."""
    try:
        return RoundStatus(value)
    except ValueError:
        return RoundStatus.UNKNOWN


def _shard_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous, near-equal slices of ``range(n)``."""
    edges = [(n * i) // parts for i in range(parts + 1)]
    return [(edges[i], edges[i + 1]) for i in range(parts)]
