"""Progress digests: one DHT record per region carries the progress of its plan peers and spares.

Why? A coordinator follows its job by reading every peer's progress record
each tick: O(N) records of ~1.5 KB, each signed, from a replica that holds all
of them. With digests, each member also sends a ~130-byte line
(:class:`~geotrain.swarm.records.MemberProgress`) over the data plane to its
region's *collector* (the plan's first dialable peer in that region, which
every peer derives from the plan alone); the collector publishes the lines it
holds as one signed :class:`~geotrain.swarm.records.RegionDigest` every
liveness period. The coordinator's tick then reads O(regions) records, and
reads the peers' own records only when a digest does not cover every peer or
says something moved that it must look at (a status, a plan version, new
checkpoint shards, lost blocks, a limiting link), and every
``full_read_every_s`` whatever the digests say.

Trust: a digest is a hint, the member's own signed progress record stays the
truth. The coordinator takes a line only from the collector the plan names,
for a peer the plan places in that region (or a spare whose peer record is
there), and only when it is newer than that peer's own record. A lying
collector can therefore keep a dead member looking alive until the next full
read (``full_read_every_s``), never make a live one look dead: a member its
digest leaves out is read from its own record.

- ``progress.digest``: member -> its region's collector: the member's line (meta ``line``); the reply says
  whether it was taken.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from geotrain.errors import GeotrainError, ProtocolError, StaleMessageError
from geotrain.plan import JobPlan
from geotrain.swarm.records import MemberProgress, ProgressRecord, RegionDigest
from geotrain.transport import Message, Transport

__all__ = ["DIGEST_KIND", "DigestBook", "DigestRelay", "member_line"]

logger = logging.getLogger(__name__)

DIGEST_KIND = "progress.digest"
#: lines a collector holds at most (a region of a plan has fewer peers; the record's own cap is 2048)
MAX_MEMBERS = 2048


def member_line(record: ProgressRecord) -> MemberProgress:
    """The digest line of a progress record: what the coordinator's tick needs of it."""
    return MemberProgress(
        plan_version=record.plan_version,
        step=record.step,
        round=record.round,
        tokens=record.tokens,
        loss=record.loss,
        status=record.status,
        updated_at=record.updated_at,
        shard_step=max((s.step for s in record.shards), default=None),
        links=len(record.links_in),
        lost="lost_round" in record.stats,
    )


@dataclass(frozen=True)
class _Entry:
    line: MemberProgress
    received: float  # the collector's clock when the line came


class DigestBook:
    """A collector's lines, by member: pure, clock passed in. Owned by whoever holds its lock (the relay).

    ``accept`` validates a line as it came off the wire and raises :class:`ProtocolError` for a malformed
    one; ``fresh`` returns the lines younger than ``max_age_s``.
    """

    def __init__(self, *, max_members: int = MAX_MEMBERS) -> None:
        self.max_members = max_members
        self._lines: dict[str, _Entry] = {}
        self._key: tuple[str, int] | None = None  # (job id, plan version) the lines belong to

    def reset(self, job_id: str, plan_version: int) -> None:
        """Start over for another plan: lines of an older one say nothing about this one's members."""
        if self._key != (job_id, plan_version):
            self._key, self._lines = (job_id, plan_version), {}

    def accept(self, member: str, raw: Any, now: float) -> MemberProgress:
        """Validate ``raw`` (a line as decoded from the wire) and keep it as ``member``'s newest line."""
        try:
            line = MemberProgress.model_validate(raw, strict=True)
        except (ValidationError, ValueError, TypeError) as e:
            raise ProtocolError(f"progress line from {member!r} is malformed: {_first_error(e)}") from None
        if member not in self._lines and len(self._lines) >= self.max_members:
            raise ProtocolError(f"progress line from {member!r} refused: {self.max_members} members held already")
        old = self._lines.get(member)
        if old is None or line.updated_at >= old.line.updated_at:  # a reordered older line changes nothing
            self._lines[member] = _Entry(line, now)
        return line

    def fresh(self, now: float, max_age_s: float) -> dict[str, MemberProgress]:
        """Lines received within ``max_age_s`` of ``now``; older ones are forgotten."""
        self._lines = {m: e for m, e in self._lines.items() if now - e.received <= max_age_s}
        return {m: e.line for m, e in self._lines.items()}


def _first_error(e: Exception) -> str:
    if isinstance(e, ValidationError) and e.errors():
        err = e.errors()[0]
        return f"{'.'.join(str(x) for x in err['loc']) or 'line'}: {err['msg']}"
    return str(e)


class DigestRelay:
    """A peer's part in the digests: it sends its line to its region's collector, or, being the collector,
    gathers the lines and publishes the region's digest.

    ``plan`` returns the peer's current plan (None: none). :meth:`serve` registers the handler (once);
    :meth:`published` is called after each of this peer's progress writes with the record written.
    Thread ownership: the book and ``_pending`` are guarded by ``_lock`` (the handler pool writes the book,
    the progress thread reads it); sends run on one background thread, at most one at a time.
    """

    def __init__(self, transport: Transport, swarm: Any, *, region: str, plan: Callable[[], JobPlan | None],
                 clock: Callable[[], float] = time.monotonic, send_timeout_s: float = 5.0) -> None:
        self.transport, self.swarm, self.region = transport, swarm, region
        self._plan, self._clock, self.send_timeout_s = plan, clock, send_timeout_s
        self._lock = threading.Lock()
        self._book = DigestBook()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gt-digest")
        self._pending: concurrent.futures.Future[Any] | None = None
        self.sent = self.refused = self.published_count = 0

    def serve(self) -> None:
        self.transport.serve(DIGEST_KIND, self._on_line)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def flush(self, timeout: float) -> None:
        """Wait until the line on its way to the collector (if any) was delivered or given up on (``sent`` or
        ``refused`` counts it); TimeoutError after ``timeout`` seconds."""
        with self._lock:
            pending = self._pending
        if pending is not None:
            concurrent.futures.wait([pending], timeout=timeout)
            if not pending.done():
                raise TimeoutError(f"the progress line to the collector is still on its way after {timeout}s")

    # -- the collector's side ----------------------------------------------------------------------
    def _on_line(self, msg: Message) -> Message:
        plan = self._plan()
        if plan is None or msg.job != plan.job_id:
            raise StaleMessageError(f"progress line from {msg.sender!r} for job {msg.job!r}, not ours")
        if msg.plan_version != plan.version:
            raise StaleMessageError(f"progress line from {msg.sender!r} for plan v{msg.plan_version}, "
                                    f"ours is v{plan.version}")
        if plan.collector(self.region) != self.transport.peer_id:
            raise StaleMessageError(f"progress line from {msg.sender!r}: this peer collects no region's lines")
        # a spare has no region in the plan: its line goes to its region's collector, or the first region's
        if plan.region_of(msg.sender) != self.region and msg.sender not in plan.spares:
            raise StaleMessageError(f"progress line from {msg.sender!r}, which the plan puts in no stage of "
                                    f"region {self.region}")
        with self._lock:
            self._book.reset(plan.job_id, plan.version)
            self._book.accept(msg.sender, msg.meta.get("line"), self._clock())
        return Message(kind=f"{DIGEST_KIND}.ack", meta={"ok": True})

    def _publish(self, plan: JobPlan, own: MemberProgress, *, period_s: float, ttl_s: float) -> None:
        # a line is dropped once it could not be renewed before its member's own record expires (3 periods and
        # an RPC timeout): the digest then leaves the member out within one more period, and the coordinator
        # reads its own record
        now = self._clock()
        with self._lock:
            self._book.reset(plan.job_id, plan.version)
            self._book.accept(self.transport.peer_id, own.to_wire(), now)
            members = self._book.fresh(now, max(period_s, ttl_s - period_s))
        digest = RegionDigest(collector=self.transport.peer_id, job_id=plan.job_id, plan_version=plan.version,
                              region=self.region, updated_at=time.time(), members=members)
        try:
            self.swarm.publish_digest(digest, ttl_s=ttl_s)
            self.published_count += 1
        except GeotrainError as e:
            logger.info("region digest not published: %s", e)

    # -- every member ------------------------------------------------------------------------------
    def published(self, record: ProgressRecord, *, period_s: float, ttl_s: float) -> None:
        """This peer just wrote ``record`` (its progress, ``ttl_s`` of lifetime, renewed every ``period_s``)."""
        plan = self._plan()
        if plan is None or plan.job_id != record.job_id or plan.version != record.plan_version:
            return
        me = self.transport.peer_id
        if me in plan.spares:
            collector = plan.spare_collector(self.region)
        elif plan.region_of(me) == self.region:
            collector = plan.collector(self.region)
        else:
            return  # not in this plan (moved out of it): the coordinator reads its own record
        if collector is None:
            return  # no dialable peer in the plan to collect: the coordinator reads every record
        line = member_line(record)
        if collector == me:
            self._publish(plan, line, period_s=period_s, ttl_s=ttl_s)
            return
        slot = next(s for pipe in plan.pipelines for s in pipe if s.peer == collector)
        with self._lock:
            if self._pending is not None and not self._pending.done():
                return  # the last line is still on its way: this one would only queue behind it
            self._pending = self._pool.submit(self._send, plan, slot.peer, slot.endpoint, slot.curve_public_key,
                                              line)

    def _send(self, plan: JobPlan, collector: str, endpoint: str, curve_key: str | None,
              line: MemberProgress) -> None:
        try:
            self.transport.connect(collector, endpoint, region=self.region,
                                   curve_server_key=curve_key.encode() if curve_key else None)
            self.transport.request(collector, Message(kind=DIGEST_KIND, job=plan.job_id, plan_version=plan.version,
                                                      meta={"line": line.to_wire(), "region": self.region}),
                                   timeout=self.send_timeout_s)
            self.sent += 1
        except GeotrainError as e:  # the coordinator reads this peer's own record instead
            self.refused += 1
            logger.debug("progress line to collector %s not delivered: %s", collector, e)
