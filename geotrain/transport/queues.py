"""What the endpoint's I/O thread keeps per peer and per message, and the counters it exposes.

Owned by :class:`~geotrain.transport.endpoint.Transport`'s I/O thread (except
:class:`TransportStats`, a snapshot handed to callers).
"""

from __future__ import annotations

import collections
import concurrent.futures
from dataclasses import dataclass, field
from typing import Any

import zmq

from geotrain.transport.wire import Header, WireTensor


@dataclass
class TransportStats:
    """Counters since start. ``dropped`` maps a reason (error class name) to a count."""

    sent_bytes: collections.Counter[str] = field(default_factory=collections.Counter)
    recv_bytes: collections.Counter[str] = field(default_factory=collections.Counter)
    sent_messages: int = 0
    recv_messages: int = 0
    dropped: collections.Counter[str] = field(default_factory=collections.Counter)
    relayed_bytes: int = 0  # bytes this peer forwarded as a relay for two others
    striped_sent: int = 0  # messages sent split over several connections (TransportConfig.streams)
    striped_recv: int = 0  # messages received that way and reassembled


@dataclass
class _Outgoing:
    frames: list[Any]
    nbytes: int
    future: concurrent.futures.Future[int]
    ready_at: float
    deadline: float
    parts: list[list[Any]] | None = None  # a striped message's parts, one per connection (see stripes.py)
    sent_parts: int = 0  # parts handed to ZMQ so far


@dataclass
class _Inbound:
    header: Header
    tensors: tuple[WireTensor, ...]
    nbytes: int
    route: bytes | None  # ROUTER identity to reply through, if it came in on the inbox
    via: str | None = None  # the peer whose connection (our outbox) it came in on, if not the inbox
    origin: str | None = None  # the IP address it came from (inbox only; ZMQ's Peer-Address)
    relayed_from: str | None = None  # the peer that sent it through the relay ``via``
    seq: int = 0  # arrival order in the mailbox (which unclaimed message is the oldest)


@dataclass
class _Remote:
    address: str
    region: str
    server_key: bytes | None = None
    socket: zmq.Socket[Any] | None = None
    monitor: zmq.Socket[Any] | None = None  # CURVE only: tells us when a handshake was refused
    redial_s: float = 0.25  # backoff before dialing again after a refused handshake
    refused: bool = False  # the last handshake was refused (and not yet redialled successfully)
    pending: collections.deque[_Outgoing] = field(default_factory=collections.deque)
    held: bool = False  # relay traffic for a peer not connect()ed yet: kept until it is, then sent
    extra: list[zmq.Socket[Any]] = field(default_factory=list)  # more connections (another region, streams > 1)
    extra_monitors: list[zmq.Socket[Any]] = field(default_factory=list)  # CURVE only: theirs, as ``monitor``


HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
HANDSHAKE_EVENTS = HANDSHAKE_FAILED | zmq.EVENT_HANDSHAKE_SUCCEEDED


def _done(fut: concurrent.futures.Future[int], value: int) -> None:
    try:
        fut.set_result(value)
    except concurrent.futures.InvalidStateError:
        pass  # the caller gave up (cancelled) just before


def _fail(fut: concurrent.futures.Future[int], err: Exception) -> None:
    try:
        fut.set_exception(err)
    except concurrent.futures.InvalidStateError:
        pass
