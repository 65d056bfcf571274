"""One large message over several TCP connections: split on the sender, reassembled on the receiver.

On a long fat link one TCP connection carries at most its window per round trip: with Linux's stock
``tcp_wmem`` maximum (4 MiB, about half of it payload) a 1 Gbit/s, 80 ms link (a 10 MB bandwidth-delay
product) gets about 200 Mbit/s from one connection, and several connections fill it (docs/benchmarks.md,
"Several TCP connections per link"). So a transport with ``streams = K > 1`` opens K connections to each
peer in another region, and sends a message of ``stripe_min_bytes`` or more as K *parts*, part ``k`` on
connection ``k``::

    part 0       [stripe header, the message's own header, payload slices]
    part k > 0   [stripe header, payload slices]

The payload is the message's buffer frames end to end (``total`` bytes); part ``k`` carries bytes
``[k * total // K, (k + 1) * total // K)`` of it, as zero-copy slices of the sender's buffers. The stripe
header is an ordinary wire header of kind :data:`STRIPE` whose meta is ``{"id", "part", "parts",
"total"}``. The receiver (:class:`Reassembly`) keeps each part and, once all K are in, copies them end to
end into one buffer and hands the original header and that buffer, cut at the header's declared frame
lengths, to the normal checks. Every part is checked before it is kept: its counts and its length against
the range it must cover, the whole against the message limits. Parts are kept as they arrived until the last
one (so a part that claims a large total costs only its own bytes); the bytes pending at once are bounded
(``limits.max_buffered_bytes``), as are the stripes per sender, and a stripe whose parts do not all arrive
within ``timeout_s`` (the transport gives it twice its receive timeout) is dropped. Nothing is unpickled; a
bad part is a :class:`~geotrain.errors.ProtocolError`.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from geotrain.errors import BadTensorError, FrameTooLargeError, ProtocolError
from geotrain.transport.config import MAX_STREAMS, Limits
from geotrain.transport.wire import Header, unpack_header

__all__ = ["MAX_STREAMS", "STRIPE", "Reassembly", "StripeError", "part_range", "split_message"]

#: message kind of a stripe part
STRIPE = "__stripe__"
#: stripes one sender may have pending at once
MAX_PENDING_PER_SENDER = 64


class StripeError(ProtocolError):
    """A stripe part that does not fit its stripe (counts, lengths, limits) or a stripe that never completed."""


def part_range(part: int, parts: int, total: int) -> tuple[int, int]:
    """Bytes ``[start, end)`` of the payload that ``part`` of ``parts`` carries."""
    return part * total // parts, (part + 1) * total // parts


def split_message(frames: Sequence[Any], parts: int, stripe_id: int,
                  stripe_header: Any) -> list[list[Any]]:
    """The K parts of a message (``frames`` = header then buffers). ``stripe_header(meta) -> bytes`` packs
    a part's stripe header. Slices are memoryviews of the sender's buffers: no payload byte is copied."""
    views = [memoryview(f).cast("B") for f in frames[1:]]
    total = sum(v.nbytes for v in views)
    out: list[list[Any]] = []
    i, pos = 0, 0  # current buffer, offset within it
    for k in range(parts):
        start, end = part_range(k, parts, total)
        meta = {"id": stripe_id, "part": k, "parts": parts, "total": total}
        part: list[Any] = [stripe_header(meta)]
        if k == 0:
            part.append(frames[0])
        need = end - start
        while need > 0:
            v = views[i]
            take = min(need, v.nbytes - pos)
            part.append(v[pos : pos + take])
            need -= take
            pos += take
            if pos == v.nbytes:
                i, pos = i + 1, 0
        while i < len(views) and views[i].nbytes == 0:  # empty buffers carry nothing: skip them
            i += 1
        out.append(part)
    return out


def _int(meta: dict[str, Any], key: str, low: int, high: int) -> int:
    v = meta.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise StripeError(f"stripe header field {key!r} must be an integer in {low}..{high}; got {v!r}")
    return v


@dataclass
class _Pending:
    parts: int
    total: int
    started: float
    got: dict[int, list[Any]] = field(default_factory=dict)  # part -> its frames, kept as they came (no copy)
    held: int = 0  # payload bytes received so far
    header: bytes | None = None
    first: Any = None  # part 0's stripe-header frame (its CURVE User-Id proves the sender)
    route: bytes | None = None
    via: str | None = None


@dataclass(frozen=True)
class Completed:
    """A reassembled message: its header frame, its buffers (cut at the header's declared lengths), and where
    part 0 came in (route, outbox, first frame) for replies and sender proofs."""

    header: bytes
    buffers: tuple[memoryview, ...]
    route: bytes | None
    via: str | None
    first: Any


class Reassembly:
    """Pending stripes by ``(sender, id)``. Owned by the transport's I/O thread; ``now`` is injected."""

    def __init__(self, limits: Limits, timeout_s: float) -> None:
        self.limits = limits
        self.timeout_s = timeout_s
        self._pending: collections.OrderedDict[tuple[str, int], _Pending] = collections.OrderedDict()
        self._bytes = 0
        self._per_sender: collections.Counter[str] = collections.Counter()

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    def add(self, sender: str, meta: dict[str, Any], frames: Sequence[Any], now: float, *,
            route: bytes | None = None, via: str | None = None, first: Any = None) -> Completed | None:
        """File one part (``frames``: the part's frames after its stripe header); the whole message once the
        last part is in, else None. Raises :class:`StripeError` (the stripe is dropped) on a part that does
        not fit."""
        stripe_id = _int(meta, "id", 0, 2**63 - 1)
        parts = _int(meta, "parts", 2, MAX_STREAMS)
        part = _int(meta, "part", 0, parts - 1)
        total = _int(meta, "total", 1, self.limits.max_message_bytes)
        key = (sender, stripe_id)
        entry = self._pending.get(key)
        try:
            if entry is None:
                if self._per_sender[sender] >= MAX_PENDING_PER_SENDER:
                    raise StripeError(f"{sender} has {MAX_PENDING_PER_SENDER} stripes pending already")
                entry = _Pending(parts, total, now)
            elif (entry.parts, entry.total) != (parts, total):
                raise StripeError(f"stripe {stripe_id} of {sender}: part {part} says {parts} parts of {total} "
                                  f"bytes, an earlier one {entry.parts} of {entry.total}")
            if part in entry.got:
                raise StripeError(f"stripe {stripe_id} of {sender}: part {part} came twice")
            payload = list(frames)
            if part == 0:
                if not payload:
                    raise StripeError("stripe part 0 carries no message header")
                header = bytes(memoryview(payload.pop(0)))
                if len(header) > self.limits.max_header_bytes:
                    raise FrameTooLargeError(f"header of {len(header)} bytes exceeds the "
                                             f"{self.limits.max_header_bytes}-byte limit")
            if len(payload) > self.limits.max_frames:
                raise FrameTooLargeError(f"stripe part has {len(payload)} frames; the limit is "
                                         f"{self.limits.max_frames}")
            start, end = part_range(part, parts, total)
            size = sum(memoryview(f).nbytes for f in payload)
            if size != end - start:
                raise StripeError(f"stripe {stripe_id} of {sender}: part {part} carries {size} bytes, "
                                  f"its range is {end - start}")
            # what is held is what arrived (a part claiming a large total allocates nothing for it)
            if self._bytes + size > self.limits.max_buffered_bytes:
                raise FrameTooLargeError(f"holding {size} more bytes would hold more than "
                                         f"{self.limits.max_buffered_bytes} bytes of pending stripes")
        except ProtocolError:
            if key in self._pending:
                self._forget(key)
            raise
        if key not in self._pending:
            self._pending[key] = entry
            self._per_sender[sender] += 1
        entry.got[part] = payload
        entry.held += size
        self._bytes += size
        if part == 0:
            entry.header, entry.first, entry.route, entry.via = header, first, route, via
        if len(entry.got) < parts:
            return None
        self._forget(key)
        assert entry.header is not None
        return Completed(entry.header, self._cut(entry), entry.route, entry.via, entry.first)

    def _cut(self, entry: _Pending) -> tuple[memoryview, ...]:
        """The parts copied end to end into one buffer, cut at the declared frame lengths of the header."""
        h: Header = unpack_header(entry.header or b"", self.limits)
        declared = [n for t in h.tensors for n in t["frames"]]
        if sum(declared) != entry.total:
            raise BadTensorError(f"striped message header declares {sum(declared)} buffer bytes; its stripe "
                                 f"carried {entry.total}")
        buf = bytearray(entry.total)
        pos = 0
        for part in range(entry.parts):
            for f in entry.got[part]:
                v = memoryview(f).cast("B")
                buf[pos : pos + v.nbytes] = v
                pos += v.nbytes
        view = memoryview(buf)
        out, pos = [], 0
        for n in declared:
            out.append(view[pos : pos + n])
            pos += n
        return tuple(out)

    def expire(self, now: float) -> list[tuple[str, int]]:
        """Drop the stripes whose parts did not all arrive within ``timeout_s``; their ``(sender, id)``."""
        gone = [k for k, e in self._pending.items() if now - e.started > self.timeout_s]
        for k in gone:
            self._forget(k)
        return gone

    def _forget(self, key: tuple[str, int]) -> None:
        entry = self._pending.pop(key)
        self._bytes -= entry.held
        self._per_sender[key[0]] -= 1
        if self._per_sender[key[0]] <= 0:
            del self._per_sender[key[0]]
