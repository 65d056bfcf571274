"""One peer's data-plane endpoint over ZeroMQ.

Shape: an *inbox* ROUTER socket bound on ``host:port`` (port 0 = any; the real
address is read back), and one *outbox* DEALER socket per remote peer. A single
I/O thread owns every socket (ZMQ sockets are not thread-safe); other threads
talk to it through a command queue plus an inproc wake-up socket.

Receiving: the I/O thread checks each inbound message's header and frame
lengths (cheap; see :mod:`geotrain.transport.wire`) and files it in a mailbox
by ``(kind, tag)``. :meth:`Transport.recv` takes the first match and decodes
its tensors in the *caller's* thread, so codec work overlaps with I/O. A bad
message is counted by reason, logged once per reason, and dropped; the loop
keeps serving. Foreign or stale traffic (another job, an older plan version)
is dropped the same way once :meth:`set_context` is called.

Sending: tensors are encoded in the caller's thread, frames are handed to the
I/O thread without copies, and :meth:`send` returns when ZMQ took them (or
raises :class:`~geotrain.errors.PeerTimeoutError`). ZMQ never reports
delivery; a dead peer shows up as a receive timeout on the protocol above.

Request/response (:meth:`request` / :meth:`serve`): replies travel back on
the requester's own connection through the ROUTER, so a server never dials
an address a client chose.

Bind vs announce: the inbox binds ``config.host:config.port``
(:attr:`Transport.bound_address`); other peers dial :attr:`Transport.address`,
the first of :attr:`Transport.endpoints` (``config.announce``, else the bound
address, else the interfaces' addresses when bound to ``0.0.0.0``/``::``; see
:mod:`geotrain.transport.addresses`).

Dial-back (peers behind NAT): a transport in *dial-out* mode publishes
:data:`~geotrain.transport.addresses.DIAL_BACK` and says hello on every outbox
it opens (and every ``keepalive_s``). A peer that calls ``connect()`` with that
address opens no socket: it learns the ROUTER route of the hello's connection
and sends over it, so both directions flow over the connection the NATed peer
opened. With CURVE the route counts only if the hello came with the key the
peer was connected with (ZAP's User-Id), so no member can take another's route.

Relays (two peers behind NAT): ``connect(peer, "dialback://<relay id>")`` on a
dial-out transport sends to ``peer`` through the relay peer (which both have
connected): each message goes to the relay wrapped in a ``__relay__`` header
naming its destination; the relay forwards the frames untouched, behind a
``__relayed__`` header naming the sender, over the destination's own
connection. The destination accepts the inner message only if its sender is
the one the relay names; with CURVE every hop is authenticated and encrypted,
and the relay (a member) sees the frames in clear and is trusted to name the
sender truthfully. On a transport that is not dial-out the relay part is
ignored: it reaches the peer over its own connection, as for ``dialback://``.

Several connections (``config.streams`` > 1): to a peer in another region the transport opens that many
outboxes and sends a message of ``config.stripe_min_bytes`` or more as one part per connection, which the
receiver reassembles before its usual checks (:mod:`geotrain.transport.stripes`); smaller messages, and
every message to a dial-back or relayed peer, go whole over the first connection.

Emulation: an ``emulator`` with ``before_send(dst_region, nbytes) -> seconds``
holds each message that long before it reaches the socket (one-way delay and
serialisation at an emulated rate, FIFO per destination). Emulation only.
"""

from __future__ import annotations

import collections
import concurrent.futures
import heapq
import itertools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import zmq

from geotrain.errors import (
    AuthenticationError,
    PeerTimeoutError,
    ProtocolError,
    StaleMessageError,
    TransportError,
)
from geotrain.transport import message as msgcodec
from geotrain.transport.addresses import DIAL_BACK, advertised_endpoints
from geotrain.transport.config import TransportConfig
from geotrain.transport.linkmeter import STAMP, InboundLink, InboundMeter
from geotrain.transport.message import CodecChoice, Message
from geotrain.transport.queues import (
    HANDSHAKE_EVENTS,
    TransportStats,
    _done,
    _fail,
    _Inbound,
    _Outgoing,
    _Remote,
)
from geotrain.transport.stripes import STRIPE, Reassembly, split_message
from geotrain.transport.wire import Header, check_frame_count, split_tensors, unpack_header

logger = logging.getLogger(__name__)

Handler = Callable[[Message], "Message | None"]
#: a handler that also gets the IP address the request came from (None when it came in on an outbox)
OriginHandler = Callable[[Message, "str | None"], "Message | None"]

#: message kind of a dial-out peer's hello: "answer me over this connection"
HELLO = "__hello__"
#: kinds of the relay's two headers: sender -> relay (meta "to"), relay -> destination (meta "from")
RELAY = "__relay__"
RELAYED = "__relayed__"
_VIA = "relay://"  # a remote's address when it is reached through a relay: relay://<relay peer id>


class LinkEmulator(Protocol):
    def before_send(self, dst_region: str, nbytes: int) -> float: ...


class Transport:
    """The data plane of one peer. See the module docstring for the threading model."""

    def __init__(
        self,
        config: TransportConfig,
        *,
        peer_id: str,
        region: str = "",
        emulator: LinkEmulator | None = None,
    ) -> None:
        self.config = config
        self.peer_id = peer_id
        self.region = region
        self._emulator = emulator
        self._limits = config.limits
        self._ctx: zmq.Context[Any] = zmq.Context(io_threads=1)
        self._commands: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._wake_lock = threading.Lock()
        self._wake_addr = f"inproc://geotrain-wake-{uuid.uuid4().hex}"
        self._wake_tx: zmq.Socket[Any] | None = None
        self._remotes: dict[str, _Remote] = {}
        self._mail: dict[tuple[str, tuple[Any, ...]], collections.deque[_Inbound]] = {}
        # (seq, key) per filed message, oldest first; entries of messages already taken are skipped
        self._mail_order: collections.deque[tuple[int, tuple[str, tuple[Any, ...]]]] = collections.deque()
        self._mail_seq = 0
        self._mail_bytes = 0
        self._mail_cv = threading.Condition()
        self._handlers: dict[str, Handler] = {}
        self._origin_handlers: dict[str, OriginHandler] = {}
        self._handlers_lock = threading.Lock()  # guards registration (the I/O thread only reads the dicts)
        self._rpc_waiting: set[str] = set()
        # (job, lowest plan version, jobs left): replaced whole by set_context, read by the I/O thread's filter
        self._context: tuple[str | None, int, frozenset[str]] = (None, 0, frozenset())
        self._on_newer_plan: Callable[[], None] | None = None  # set once, before traffic; called by the I/O thread
        self._stats = TransportStats()
        # guards _stats and _meter; notified on every count, for wait_stats
        self._stats_cv = threading.Condition(threading.Lock())
        self._meter = InboundMeter()  # passive link figures from stamped messages (under _stats_cv)
        self._logged: set[str] = set()
        self._pool = concurrent.futures.ThreadPoolExecutor(config.handler_threads, thread_name_prefix="gt-handler")
        self._ready = threading.Event()
        self._closed = threading.Event()
        self._shut = False
        self._address: str | None = None
        self._endpoints: tuple[str, ...] = ()
        self._dial_out = config.dial_out
        #: the reachability preflight's verdict on this peer (geotrain.peers.reachability); None = unknown
        self.reachable: bool | None = False if config.dial_out else None
        # peer -> (ROUTER route, CURVE key its hello came with) of a dial-out peer's connection to our inbox
        self._routes: dict[str, tuple[bytes, bytes | None]] = {}
        self._new_routes: set[str] = set()  # peers to flush after the last read (new route, relayed traffic)
        self._start_error: BaseException | None = None
        self._auth: Any = None
        self._allowed: set[bytes] = set()  # CURVE clients the ZAP handler admits
        self._inbox: zmq.Socket[Any] | None = None  # owned by the I/O thread
        # incomplete stripes are dropped after twice the receive timeout (their parts travel side by side, so
        # the last one trails the first by far less; pending bytes are bounded meanwhile); owned by the I/O thread
        self._stripes = Reassembly(config.limits, max(60.0, 2 * config.recv_timeout_s))
        self._stripe_ids = itertools.count()
        self._thread = threading.Thread(target=self._loop, name=f"gt-transport-{peer_id[:8]}", daemon=True)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, timeout: float = 10.0) -> Transport:
        if self.config.curve is not None:
            self._start_auth()
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TransportError(f"transport did not start within {timeout}s")
        if self._start_error is not None:
            raise TransportError(f"transport could not bind: {self._start_error}") from self._start_error
        wake = self._ctx.socket(zmq.PAIR)
        wake.connect(self._wake_addr)
        self._wake_tx = wake
        return self

    @property
    def bound_address(self) -> str:
        """The bound inbox address as ZMQ reports it, e.g. ``tcp://0.0.0.0:45123``."""
        if self._address is None:
            raise TransportError("transport not started")
        return self._address

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The addresses this peer advertises (never an unspecified one), most preferred first."""
        if self._address is None:
            raise TransportError("transport not started")
        return self._endpoints

    @property
    def address(self) -> str:
        """What other peers dial: the first advertised endpoint, or ``DIAL_BACK`` in dial-out mode."""
        if self._address is None:
            raise TransportError("transport not started")
        return DIAL_BACK if self._dial_out else self._endpoints[0]

    @property
    def dial_out(self) -> bool:
        """True when this peer accepts no inbound connections and dials out to everyone instead."""
        return self._dial_out

    def set_dial_out(self, on: bool = True) -> None:
        """Switch dial-out mode (after a failed reachability preflight); hello on every open outbox now."""
        self._dial_out = on
        if on:
            self.reachable = False
            self._command(("hello",))

    def close(self, timeout: float = 5.0) -> None:
        if self._shut:
            return
        self._shut = True  # not _closed: a failed I/O thread sets that, and the sockets must still go
        self._closed.set()
        with self._mail_cv:
            self._mail_cv.notify_all()
        if self._thread.is_alive():
            self._command(("stop",))
            self._thread.join(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._wake_lock:
            if self._wake_tx is not None:
                self._wake_tx.close(linger=0)
                self._wake_tx = None
        if self._auth is not None:
            self._auth.stop()
        self._ctx.term()

    def __enter__(self) -> Transport:
        return self.start() if not self._ready.is_set() else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- peers and context ----------------------------------------------------------------------
    def connect(self, peer_id: str, address: str, *, region: str = "", curve_server_key: bytes | None = None) -> None:
        """Open (or re-point) the outbox to ``peer_id``. Idempotent for the same address.

        With CURVE, ``curve_server_key`` is the peer's public key; ``None`` for a peer already
        connected at the same address keeps the key it was connected with.
        """
        if not address.startswith("tcp://") and not address.startswith(DIAL_BACK):
            raise TransportError(f"peer {peer_id} address must be tcp://host:port or {DIAL_BACK}; got {address!r}")
        if address.startswith(DIAL_BACK):
            relay = address[len(DIAL_BACK):]
            # two peers behind NAT meet through the relay; anyone else uses the dial-out peer's own connection
            address = f"{_VIA}{relay}" if self._dial_out and relay else DIAL_BACK
        self._command(("connect", peer_id, address, region, curve_server_key))

    def disconnect(self, peer_id: str) -> None:
        self._command(("disconnect", peer_id))

    def set_context(self, *, job: str | None, plan_version: int = 0) -> None:
        """Drop inbound traffic of jobs this peer has left and of older plan versions of ``job``.

        Swarm traffic (job "") always passes. Traffic of a job this peer has not
        joined yet is kept (bounded by ``limits.max_buffered_bytes``): a
        neighbour may switch to a new job a moment before this peer does.
        """
        with self._mail_cv:  # one writer at a time; the I/O thread sees the old context or the new one, whole
            current, _, past = self._context
            if current is not None and job != current:
                past = past | {current}
            self._context = (job, plan_version, past)
            for key in list(self._mail):
                kept = collections.deque(m for m in self._mail[key] if self._fresh(m.header))
                self._mail_bytes -= sum(m.nbytes for m in self._mail[key]) - sum(m.nbytes for m in kept)
                if kept:
                    self._mail[key] = kept
                else:
                    del self._mail[key]  # a key in the mailbox always has a message (eviction relies on it)

    def on_newer_plan(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the I/O thread: it must be quick) whenever a message of this peer's job arrives
        stamped with a plan version above :meth:`set_context`'s: its sender follows a plan this peer has not
        read yet, so the peer should read it now (a replan's news may have been lost)."""
        self._on_newer_plan = callback

    def allow_clients(self, keys: set[bytes] | frozenset[bytes]) -> None:
        """Replace the CURVE allow-list (z85 public keys of the swarm's verified members).

        In place, without a moment in which a key in both lists is missing (the ZAP thread reads it).
        """
        self._allowed.update(keys)
        self._allowed.intersection_update(keys)

    def serve(self, kind: str, handler: Handler, *, replace: bool = False) -> None:
        """Answer requests of ``kind``; the handler runs in a worker thread and returns the reply (or None).

        One handler per kind: registering a second one is a :class:`TransportError` naming the kind,
        unless ``replace=True`` says the caller means to swap it (:meth:`unserve` removes one).
        """
        with self._handlers_lock:
            self._check_free(kind, replace)
            self._origin_handlers.pop(kind, None)
            self._handlers[kind] = handler

    def serve_with_origin(self, kind: str, handler: OriginHandler, *, replace: bool = False) -> None:
        """As :meth:`serve`, the handler also given the IP address the request came from (as TCP saw it)."""
        with self._handlers_lock:
            self._check_free(kind, replace)
            self._origin_handlers[kind] = handler
            self._handlers[kind] = lambda m: handler(m, None)

    def unserve(self, kind: str) -> None:
        """Stop answering requests of ``kind`` (nothing happens when none is served)."""
        with self._handlers_lock:
            self._origin_handlers.pop(kind, None)
            self._handlers.pop(kind, None)

    def _check_free(self, kind: str, replace: bool) -> None:
        if kind in self._handlers and not replace:
            raise TransportError(
                f"a handler for {kind!r} is already registered on this transport; "
                "unserve it first or pass replace=True"
            )

    # -- sending ----------------------------------------------------------------------------------
    def send_async(
        self, peer_id: str, msg: Message, *, codec: CodecChoice = "none", timeout: float | None = None
    ) -> concurrent.futures.Future[int]:
        """Encode now, hand the frames to the I/O thread; the future gives the bytes handed to ZMQ."""
        return self._submit(peer_id, msg, codec=codec, timeout=timeout)[0]

    def _submit(
        self, peer_id: str, msg: Message, *, codec: CodecChoice, timeout: float | None,
        rpc: dict[str, Any] | None = None,
    ) -> tuple[concurrent.futures.Future[int], float]:
        if self._closed.is_set():
            raise TransportError("transport closed")
        frames = msgcodec.encode(msg, sender=self.peer_id, codec=codec, rpc=rpc)
        nbytes = sum(memoryview(f).nbytes for f in frames)
        now = time.monotonic()
        # the one read of ``_remotes`` off the I/O thread (its only writer): one dict lookup and the entry's
        # region, a str the I/O thread replaces whole; both single operations under the interpreter lock
        remote = self._remotes.get(peer_id) if self._emulator is not None else None
        delay = 0.0
        if self._emulator is not None and remote is not None:
            delay = self._emulator.before_send(remote.region, nbytes)
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        timeout = self.config.send_timeout_s if timeout is None else timeout
        out = _Outgoing(frames, nbytes, fut, now + delay, now + delay + timeout)
        self._command(("send", peer_id, out))
        return fut, delay

    def send(self, peer_id: str, msg: Message, *, codec: CodecChoice = "none", timeout: float | None = None) -> int:
        timeout = self.config.send_timeout_s if timeout is None else timeout
        fut, delay = self._submit(peer_id, msg, codec=codec, timeout=timeout)
        try:
            # an emulated link's own delay is not the peer's fault: it extends the deadline
            return fut.result(timeout=timeout + delay)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise PeerTimeoutError(
                f"send of {msg.kind} to {peer_id} not accepted within {timeout}s", peer=peer_id, step=msg.step
            ) from None

    # -- receiving --------------------------------------------------------------------------------
    def recv(self, kind: str, tag: tuple[Any, ...] | None = None, *, timeout: float | None = None) -> Message:
        """The next message of ``kind`` (and ``tag``, if given), decoded; PeerTimeoutError when none comes."""
        timeout = self.config.recv_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            item = self._take(kind, tag, deadline)
            try:
                msg = msgcodec.decode(item.header, item.tensors)
            except ProtocolError as e:
                self._drop(e, item.header.sender)
                continue
            return msg

    def request(
        self, peer_id: str, msg: Message, *, codec: CodecChoice = "none", timeout: float | None = None
    ) -> Message:
        """Send ``msg`` to a peer's :meth:`serve` handler and wait for its reply."""
        timeout = self.config.recv_timeout_s if timeout is None else timeout
        rid = uuid.uuid4().hex
        with self._mail_cv:
            self._rpc_waiting.add(rid)
        try:
            self._submit(peer_id, msg, codec=codec, timeout=timeout, rpc={"id": rid, "reply": False})
            try:
                return self.recv("__rpc__", (rid,), timeout=timeout)
            except PeerTimeoutError:
                raise PeerTimeoutError(
                    f"no reply to {msg.kind} from {peer_id} within {timeout}s", peer=peer_id, step=msg.step
                ) from None
        finally:
            with self._mail_cv:
                self._rpc_waiting.discard(rid)
                self._mail.pop(("__rpc__", (rid,)), None)

    def discard(self, kind: str, predicate: Callable[[tuple[Any, ...]], bool]) -> int:
        """Drop waiting messages of ``kind`` whose tag matches ``predicate`` (e.g. older steps)."""
        n = 0
        with self._mail_cv:
            for key in [k for k in self._mail if k[0] == kind and predicate(k[1])]:
                q = self._mail.pop(key)
                n += len(q)
                self._mail_bytes -= sum(m.nbytes for m in q)
        return n

    def inbound_links(self) -> dict[str, InboundLink]:
        """Passive figures of the links into this peer, per sender, from its stamped messages of the last minute
        (:mod:`geotrain.transport.linkmeter`)."""
        with self._stats_cv:
            return self._meter.links()

    @property
    def stats(self) -> TransportStats:
        with self._stats_cv:
            return self._stats_copy()

    def wait_stats(self, predicate: Callable[[TransportStats], object], timeout: float) -> TransportStats:
        """Block until ``predicate(stats)`` holds, woken by each count (a message sent, received, relayed or
        dropped), not by polling; the stats that satisfied it. TimeoutError after ``timeout`` seconds.
        ``predicate`` gets a copy of the counters, under the stats lock: it must not call this transport."""
        with self._stats_cv:
            if not self._stats_cv.wait_for(lambda: predicate(self._stats_copy()), timeout):
                raise TimeoutError(f"transport stats did not reach the condition within {timeout}s: "
                                   f"{self._stats_copy()}")
            return self._stats_copy()

    def _stats_copy(self) -> TransportStats:
        """A copy of the counters (the caller holds ``_stats_cv``)."""
        return TransportStats(
            sent_bytes=collections.Counter(self._stats.sent_bytes),
            recv_bytes=collections.Counter(self._stats.recv_bytes),
            sent_messages=self._stats.sent_messages,
            recv_messages=self._stats.recv_messages,
            dropped=collections.Counter(self._stats.dropped),
            relayed_bytes=self._stats.relayed_bytes,
            striped_sent=self._stats.striped_sent,
            striped_recv=self._stats.striped_recv,
        )

    # -- internals: mailbox -----------------------------------------------------------------------
    def _fresh(self, h: Header) -> bool:
        job, min_plan, past = self._context
        if job is None or h.job == "":
            return True
        if h.job == job:
            return h.plan >= min_plan
        return h.job not in past

    def _take(self, kind: str, tag: tuple[Any, ...] | None, deadline: float) -> _Inbound:
        with self._mail_cv:
            while True:
                if self._closed.is_set():
                    raise TransportError("transport closed")
                keys = [(kind, tag)] if tag is not None else [k for k in self._mail if k[0] == kind]
                for key in keys:
                    q = self._mail.get(key)
                    if q:
                        item = q.popleft()
                        if not q:
                            del self._mail[key]
                        self._mail_bytes -= item.nbytes
                        return item
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerTimeoutError(f"no {kind} message{'' if tag is None else f' {tag}'} in time")
                self._mail_cv.wait(left)

    def _file(self, item: _Inbound) -> None:
        h = item.header
        if h.rpc is not None and h.rpc.get("reply"):
            key: tuple[str, tuple[Any, ...]] = ("__rpc__", (h.rpc["id"],))
        else:
            key = (h.kind, h.tag)
        with self._mail_cv:
            if key[0] == "__rpc__" and key[1][0] not in self._rpc_waiting:
                self._count_drop("UnexpectedReply", h.sender)
                return
            self._mail_seq += 1
            item.seq = self._mail_seq
            self._mail.setdefault(key, collections.deque()).append(item)
            self._mail_order.append((item.seq, key))
            self._mail_bytes += item.nbytes
            # Unclaimed traffic must not grow without bound: evict the oldest unclaimed message. A key's queue
            # is taken from its head, so an order entry is still unclaimed exactly when it is its queue's head.
            while self._mail_bytes > self._limits.max_buffered_bytes and self._mail_order:
                seq, old = self._mail_order.popleft()
                q = self._mail.get(old)
                if not q or q[0].seq != seq:
                    continue  # taken already
                gone = q.popleft()
                self._mail_bytes -= gone.nbytes
                if not q:
                    del self._mail[old]
                self._count_drop("MailboxOverflow", gone.header.sender)
            if len(self._mail_order) > 4 * (len(self._mail) + 64):
                self._mail_order = collections.deque(
                    (seq, k) for seq, k in self._mail_order if self._mail.get(k) and seq >= self._mail[k][0].seq)
            self._mail_cv.notify_all()

    def _drop(self, err: Exception, sender: str) -> None:
        self._count_drop(type(err).__name__, sender, str(err))

    def _count_drop(self, reason: str, sender: str, detail: str = "") -> None:
        with self._stats_cv:
            self._stats.dropped[reason] += 1
            self._stats_cv.notify_all()
        if reason not in self._logged:
            self._logged.add(reason)
            logger.warning("dropped a message from %r: %s %s (further ones counted only)", sender, reason, detail)

    # -- internals: the I/O thread ----------------------------------------------------------------
    def _command(self, cmd: tuple[Any, ...]) -> None:
        self._commands.put(cmd)
        with self._wake_lock:
            if self._wake_tx is not None:
                try:
                    self._wake_tx.send(b"", zmq.NOBLOCK)
                except zmq.Again:
                    pass  # a wake-up is already pending

    def _start_auth(self) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        curve = self.config.curve
        assert curve is not None
        self._allowed.update(curve.allowed_clients)
        allowed = self._allowed
        count = self._count_drop

        class _Keys:
            def callback(self, domain: str, key: bytes) -> bool:
                ok = key in allowed
                if not ok:
                    count("AuthenticationError", "?", "a CURVE client not on the allow-list was refused")
                return ok

        self._auth = ThreadAuthenticator(self._ctx)
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=_Keys())

    def _open_inbox(self) -> zmq.Socket[Any]:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.MAXMSGSIZE, self._limits.max_frame_bytes)
        sock.setsockopt(zmq.LINGER, int(self.config.linger_s * 1000))
        sock.setsockopt(zmq.RCVHWM, 1000)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a route that is gone fails instead of vanishing
        if self.config.curve is not None:
            sock.curve_secretkey = self.config.curve.secret_key
            sock.curve_publickey = self.config.curve.public_key
            sock.curve_server = True
        host = self.config.host
        if ":" in host.strip("[]"):
            sock.setsockopt(zmq.IPV6, 1)
            host = f"[{host.strip('[]')}]"
        sock.bind(f"tcp://{host}:{self.config.port}")
        self._address = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._endpoints = advertised_endpoints(self._address, self.config.announce)
        self._inbox = sock
        return sock

    def _dial(self, peer: str, remote: _Remote, poller: zmq.Poller, by_socket: dict[Any, str]) -> bool:
        """(Re)open the outbox of ``remote``; with CURVE, watch its handshake. False if it cannot be opened."""
        self._hang_up(remote, poller, by_socket)
        if remote.address == DIAL_BACK or remote.address.startswith(_VIA):
            return True  # no socket: sent over the route its own hello came in on, or through a relay
        try:
            remote.socket = self._open_outbox(remote, remote.server_key)
        except (zmq.ZMQError, AuthenticationError) as e:
            logger.warning("cannot connect to %s at %s: %s", peer, remote.address, e)
            return False
        by_socket[remote.socket] = peer
        poller.register(remote.socket, zmq.POLLIN)
        if self.config.streams > 1 and remote.region and self.region and remote.region != self.region:
            for _ in range(self.config.streams - 1):  # more connections to a peer in another region
                sock = self._open_outbox(remote, remote.server_key)
                remote.extra.append(sock)
                by_socket[sock] = peer
                poller.register(sock, zmq.POLLIN)
        if self._dial_out:
            self._hello(peer, remote)
        if self.config.curve is not None:
            # libzmq does not dial again after a refused CURVE handshake (we may not have been on the
            # peer's allow-list yet): watch for it (on every connection) and redial them all with backoff
            remote.monitor = remote.socket.get_monitor_socket(HANDSHAKE_EVENTS)
            remote.extra_monitors = [sock.get_monitor_socket(HANDSHAKE_EVENTS) for sock in remote.extra]
            for monitor in (remote.monitor, *remote.extra_monitors):
                by_socket[monitor] = peer
                poller.register(monitor, zmq.POLLIN)
        return True

    def _hello(self, peer: str, remote: _Remote) -> None:
        """Dial-out mode: tell ``peer`` to answer over this outbox (queued by ZMQ until connected)."""
        if remote.socket is None:
            return
        frames = msgcodec.encode(Message(HELLO), sender=self.peer_id)
        try:
            remote.socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            pass  # its queue is full of real traffic, which refreshes the route just as well

    def _route_of(self, peer: str, remote: _Remote) -> bytes | None:
        """The route to a dial-back peer, if it said hello (with the CURVE key we know for it)."""
        known = self._routes.get(peer)
        if known is None:
            return None
        route, key = known
        if self.config.curve is not None and remote.server_key is not None and key != remote.server_key:
            return None
        return route

    def _learn_route(self, sender: str, route: bytes, first: zmq.Frame) -> bool:
        """Remember the route of a message from ``sender`` on the inbox; True if it is new."""
        key: bytes | None = None
        if self.config.curve is not None:
            try:
                user = first.get("User-Id")
            except zmq.ZMQError:
                return False
            key = user.encode() if isinstance(user, str) else None
        if self._routes.get(sender) == (route, key):
            return False
        self._routes[sender] = (route, key)
        return True

    def _is_monitor(self, sock: Any, by_socket: dict[Any, str]) -> bool:
        peer = by_socket.get(sock)
        remote = self._remotes.get(peer) if peer is not None else None
        return remote is not None and (sock is remote.monitor or any(sock is m for m in remote.extra_monitors))

    def _on_handshake_event(self, peer: str, monitor: zmq.Socket[Any], redials: dict[str, float]) -> None:
        from zmq.utils.monitor import recv_monitor_message

        event: Any = recv_monitor_message(monitor)
        remote = self._remotes[peer]
        if event.get("event") == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            remote.refused, remote.redial_s = False, 0.25
            return
        remote.refused = True
        if peer in redials:
            return  # another of its connections was refused too: one redial (of them all) is due already
        logger.info("handshake with %s refused (event %s); dialing again in %.2fs",
                    peer, event.get("event"), remote.redial_s)
        redials[peer] = time.monotonic() + remote.redial_s
        remote.redial_s = min(remote.redial_s * 2, 2.0)

    @staticmethod
    def _hang_up(remote: _Remote, poller: zmq.Poller, by_socket: dict[Any, str], linger_s: float = 0.0) -> None:
        """Close ``remote``'s sockets; what ZMQ still holds for it is sent for up to ``linger_s``, then dropped."""
        if remote.monitor is not None and remote.socket is not None:
            remote.socket.disable_monitor()
        for sock, monitor in itertools.zip_longest(remote.extra, remote.extra_monitors):
            if monitor is not None:
                sock.disable_monitor()
                poller.unregister(monitor)
                by_socket.pop(monitor, None)
                monitor.close(linger=0)
            poller.unregister(sock)
            by_socket.pop(sock, None)
            sock.close(linger=int(linger_s * 1000))
        remote.extra, remote.extra_monitors = [], []
        for attr in ("monitor", "socket"):
            sock = getattr(remote, attr)
            if sock is not None:
                poller.unregister(sock)
                by_socket.pop(sock, None)
                sock.close(linger=int(linger_s * 1000) if attr == "socket" else 0)
                setattr(remote, attr, None)

    def _open_outbox(self, remote: _Remote, curve_server_key: bytes | None) -> zmq.Socket[Any]:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.MAXMSGSIZE, self._limits.max_frame_bytes)
        sock.setsockopt(zmq.LINGER, int(self.config.linger_s * 1000))
        sock.setsockopt(zmq.SNDHWM, self.config.sndhwm)
        if self.config.curve is not None:
            if curve_server_key is None:
                raise AuthenticationError("this swarm uses CURVE: connect() needs the peer's curve_server_key")
            sock.curve_secretkey = self.config.curve.secret_key
            sock.curve_publickey = self.config.curve.public_key
            sock.curve_serverkey = curve_server_key
        sock.connect(remote.address)
        return sock

    def _loop(self) -> None:
        try:
            inbox = self._open_inbox()
            wake = self._ctx.socket(zmq.PAIR)
            wake.bind(self._wake_addr)
        except zmq.ZMQError as e:
            self._start_error = e
            self._ready.set()
            return
        self._ready.set()
        poller = zmq.Poller()
        poller.register(inbox, zmq.POLLIN)
        poller.register(wake, zmq.POLLIN)
        by_socket: dict[zmq.Socket[Any], str] = {}
        timers: list[tuple[float, int, str]] = []  # (ready_at, seq, peer) for held (emulated) sends
        redials: dict[str, float] = {}  # peer -> when to dial again after a refused handshake
        seq = itertools.count()
        running = True
        next_hello = time.monotonic() + self.config.keepalive_s
        try:
            while running:
                now = time.monotonic()
                if now >= next_hello:
                    next_hello = now + self.config.keepalive_s
                    for sender, _ in self._stripes.expire(now):
                        self._count_drop("StripeError", sender, "a striped message's parts did not all arrive "
                                         "within twice the receive timeout")
                    for peer, remote in list(self._remotes.items()):
                        if self._dial_out:
                            self._hello(peer, remote)
                        if remote.address == DIAL_BACK and remote.pending:
                            self._flush(peer, poller, timers, seq)  # fails what timed out waiting for a route
                timeout_ms = min(1000.0, max(0.0, (next_hello - now) * 1000))
                if timers:
                    timeout_ms = max(0.0, (timers[0][0] - now) * 1000)
                if redials:
                    timeout_ms = min(timeout_ms, max(0.0, (min(redials.values()) - now) * 1000))
                for sock, flags in poller.poll(int(timeout_ms)):
                    if sock is wake:
                        while wake.poll(0):
                            wake.recv()
                        running = self._run_commands(poller, by_socket, timers, seq)
                    elif sock is inbox:
                        self._receive(sock, routed=True)
                        for peer in self._new_routes:
                            self._flush(peer, poller, timers, seq)
                        self._new_routes.clear()
                    elif self._is_monitor(sock, by_socket):
                        peer = by_socket[sock]
                        self._on_handshake_event(peer, sock, redials)
                    else:
                        if flags & zmq.POLLIN:
                            self._receive(sock, routed=False, via=by_socket[sock])
                            for peer in self._new_routes:
                                self._flush(peer, poller, timers, seq)
                            self._new_routes.clear()
                        if flags & zmq.POLLOUT:
                            self._flush(by_socket[sock], poller, timers, seq)
                while timers and timers[0][0] <= time.monotonic():
                    _, _, peer = heapq.heappop(timers)
                    self._flush(peer, poller, timers, seq)
                for peer in [p for p, t in redials.items() if t <= time.monotonic()]:
                    del redials[peer]
                    again = self._remotes.get(peer)
                    if again is not None and self._dial(peer, again, poller, by_socket):
                        self._flush(peer, poller, timers, seq)
        except Exception:
            # a bug, not bad input (that is refused and counted in _receive): without this thread nothing moves,
            # so say so and close, and every blocked recv/send/request fails with TransportError instead of hanging
            logger.exception("transport I/O thread of %s failed; the transport is closed", self.peer_id)
            self._closed.set()
            with self._mail_cv:
                self._mail_cv.notify_all()
        finally:
            for remote in self._remotes.values():
                for out in remote.pending:
                    _fail(out.future, TransportError("transport closed"))
                # a message send() reported as handed over must still leave: linger, as the config says
                self._hang_up(remote, poller, by_socket, self.config.linger_s)
            inbox.close()
            wake.close()

    def _run_commands(self, poller: zmq.Poller, by_socket: dict[Any, str], timers: list[Any], seq: Any) -> bool:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return True
            op = cmd[0]
            if op == "stop":
                return False
            if op == "connect":
                _, peer, address, region, server_key = cmd
                remote = self._remotes.get(peer)
                if server_key is None and remote is not None and remote.address == address:
                    server_key = remote.server_key  # re-connecting without a key keeps the known one
                if address == DIAL_BACK and self._dial_out and remote is not None and remote.address.startswith(_VIA):
                    continue  # we are both behind NAT: only the relay the plan named reaches it; keep that
                if (remote is not None and remote.address == address
                        and (remote.socket is not None or address == DIAL_BACK or address.startswith(_VIA))
                        and remote.server_key == server_key and not remote.refused and not remote.held):
                    remote.region = region or remote.region
                    continue
                if remote is not None:
                    self._hang_up(remote, poller, by_socket)
                pending = remote.pending if remote is not None else collections.deque()
                remote = _Remote(address=address, region=region, server_key=server_key, pending=pending)
                self._remotes[peer] = remote
                if self._dial(peer, remote, poller, by_socket):
                    self._flush(peer, poller, timers, seq)
            elif op == "disconnect":
                remote = self._remotes.pop(cmd[1], None)
                if remote is not None:
                    self._hang_up(remote, poller, by_socket)
                    for out in remote.pending:
                        _fail(out.future, TransportError(f"disconnected from {cmd[1]}"))
            elif op == "send":
                _, peer, out = cmd
                remote = self._remotes.get(peer)
                if remote is None:
                    _fail(out.future, TransportError(f"unknown peer {peer}: connect() it first"))
                    continue
                remote.pending.append(out)
                self._flush(peer, poller, timers, seq)
            elif op == "reply":
                _, route, frames, to = cmd
                self._reply(route, frames, to)
            elif op == "reply_via":  # a request that came in on our outbox: answer on it
                _, to, frames = cmd
                remote = self._remotes.get(to)
                if remote is not None:
                    nbytes = sum(memoryview(f).nbytes for f in frames)
                    now = time.monotonic()
                    fut: concurrent.futures.Future[int] = concurrent.futures.Future()
                    remote.pending.append(_Outgoing(frames, nbytes, fut, now, now + self.config.send_timeout_s))
                    self._flush(to, poller, timers, seq)
            elif op == "reply_relayed":  # a request that came through a relay: answer through it
                _, to, relay, frames = cmd
                remote = self._remotes.get(to)
                if remote is None:
                    remote = self._remotes[to] = _Remote(address=f"{_VIA}{relay}", region="")
                now = time.monotonic()
                nbytes = sum(memoryview(f).nbytes for f in frames)
                done: concurrent.futures.Future[int] = concurrent.futures.Future()
                remote.pending.append(_Outgoing(frames, nbytes, done, now, now + self.config.send_timeout_s))
                self._flush(to, poller, timers, seq)
            elif op == "hello":
                for peer, remote in self._remotes.items():
                    self._hello(peer, remote)

    def _flush(self, peer: str, poller: zmq.Poller, timers: list[Any], seq: Any) -> None:
        """Send what is due for ``peer``, in order; hold the rest (emulated delay or a full queue)."""
        remote = self._remotes.get(peer)
        if remote is None:
            return
        if remote.address == DIAL_BACK:
            self._flush_back(peer, remote, timers, seq)
            return
        if remote.address.startswith(_VIA):
            self._flush_via(peer, remote, poller, timers, seq)
            return
        if remote.socket is None:
            return
        now = time.monotonic()
        while remote.pending:
            out = remote.pending[0]
            if out.future.cancelled():
                remote.pending.popleft()
                continue
            if now > out.deadline:
                remote.pending.popleft()
                _fail(out.future, PeerTimeoutError(f"send to {peer} timed out", peer=peer))
                continue
            if out.ready_at > now:
                heapq.heappush(timers, (out.ready_at, next(seq), peer))
                break
            socks = [remote.socket, *remote.extra]
            payload = out.nbytes - memoryview(out.frames[0]).nbytes  # the buffers, not the header
            if out.parts is None and len(socks) > 1 and payload >= self.config.stripe_min_bytes:
                out.parts = split_message(out.frames, len(socks), next(self._stripe_ids), self._stripe_header)
            blocked = remote.socket
            try:
                if out.parts is None:
                    remote.socket.send_multipart(out.frames, flags=zmq.NOBLOCK, copy=False)
                else:  # part k on connection k, in order; a full queue resumes at the part it stopped at
                    while out.sent_parts < len(out.parts):
                        blocked = socks[out.sent_parts % len(socks)]
                        blocked.send_multipart(out.parts[out.sent_parts], flags=zmq.NOBLOCK, copy=False)
                        out.sent_parts += 1
            except zmq.Again:
                for sock in socks:  # wake when the connection that is full has room again
                    poller.modify(sock, (zmq.POLLIN | zmq.POLLOUT) if sock is blocked else zmq.POLLIN)
                heapq.heappush(timers, (min(out.deadline, now + 0.05), next(seq), peer))
                return
            remote.pending.popleft()
            with self._stats_cv:
                self._stats.sent_bytes[peer] += out.nbytes
                self._stats.sent_messages += 1
                self._stats.striped_sent += out.parts is not None
                self._stats_cv.notify_all()
            _done(out.future, out.nbytes)
        for sock in (remote.socket, *remote.extra):
            poller.modify(sock, zmq.POLLIN)

    def _stripe_header(self, meta: dict[str, Any]) -> bytes:
        frames = msgcodec.encode(Message(STRIPE, meta=meta), sender=self.peer_id)
        return frames[0]

    def _flush_via(self, peer: str, remote: _Remote, poller: zmq.Poller, timers: list[Any], seq: Any) -> None:
        """Hand what is due for ``peer`` to its relay, each message behind a header naming ``peer``."""
        relay = remote.address[len(_VIA):]
        via = self._remotes.get(relay)
        now = time.monotonic()
        while remote.pending:
            out = remote.pending[0]
            if via is None or relay == peer:
                remote.pending.popleft()
                _fail(out.future, TransportError(f"{peer} is reached through relay {relay}, which this peer has "
                                                 "not connected"))
                continue
            if out.ready_at > now:  # emulated delay of the end-to-end link: held here, not at the relay
                heapq.heappush(timers, (out.ready_at, next(seq), peer))
                return
            remote.pending.popleft()
            header = msgcodec.encode(Message(RELAY, meta={"to": peer}), sender=self.peer_id)
            via.pending.append(_Outgoing([*header, *out.frames], out.nbytes, out.future, now, out.deadline))
        if via is not None:
            self._flush(relay, poller, timers, seq)

    def _relay(self, sender: str, header: Header, inner: list[zmq.Frame]) -> None:
        """Forward ``inner`` (a whole message from ``sender``) to the peer ``header.meta['to']``."""
        to = header.meta.get("to")
        if not isinstance(to, str) or not to or to == sender or not inner:
            self._count_drop("RelayRefused", sender, f"nothing to relay to {to!r}")
            return
        remote = self._remotes.get(to)
        if remote is None:
            # the plan names us its relay before we have connect()ed it: hold its traffic until we do
            remote = self._remotes[to] = _Remote(address=DIAL_BACK, region="", held=True)
        if remote.address.startswith(_VIA):
            self._count_drop("RelayRefused", sender, f"{to!r} is itself reached through a relay")
            return
        wrapped = [*msgcodec.encode(Message(RELAYED, meta={"from": sender}), sender=self.peer_id), *inner]
        now = time.monotonic()
        nbytes = sum(f.buffer.nbytes for f in inner)
        # emulation: the relay's own link to the destination delays the second leg
        delay = self._emulator.before_send(remote.region, nbytes) if self._emulator is not None else 0.0
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        remote.pending.append(_Outgoing(wrapped, nbytes, done, now + delay, now + delay + self.config.send_timeout_s))
        with self._stats_cv:
            self._stats.relayed_bytes += nbytes
            self._stats_cv.notify_all()
        self._new_routes.add(to)

    def _flush_back(self, peer: str, remote: _Remote, timers: list[Any], seq: Any) -> None:
        """Send what is due for a dial-back peer over the route of its own connection to our inbox."""
        assert self._inbox is not None
        now = time.monotonic()
        while remote.pending:
            out = remote.pending[0]
            if out.future.cancelled():
                remote.pending.popleft()
                continue
            if now > out.deadline:
                remote.pending.popleft()
                _fail(out.future, PeerTimeoutError(f"send to {peer} timed out: no hello from it (a dial-out "
                                                   "peer must connect to us first)", peer=peer))
                continue
            route = None if remote.held else self._route_of(peer, remote)
            if route is None:
                return  # flushed again when its hello comes in / it is connect()ed (or at the next keepalive)
            if out.ready_at > now:
                heapq.heappush(timers, (out.ready_at, next(seq), peer))
                return
            try:
                self._inbox.send_multipart([route, *out.frames], flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                heapq.heappush(timers, (min(out.deadline, now + 0.05), next(seq), peer))
                return
            except zmq.ZMQError:  # EHOSTUNREACH: that connection is gone; wait for the next hello
                self._routes.pop(peer, None)
                return
            remote.pending.popleft()
            with self._stats_cv:
                self._stats.sent_bytes[peer] += out.nbytes
                self._stats.sent_messages += 1
                self._stats_cv.notify_all()
            _done(out.future, out.nbytes)

    def _reply(self, route: bytes, frames: list[Any], to: str) -> None:
        # A request came in on the inbox: answer on the same connection.
        assert self._inbox is not None
        try:
            self._inbox.send_multipart([route, *frames], flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as e:
            logger.debug("reply to %s failed: %s", to, e)
            return
        nbytes = sum(memoryview(f).nbytes for f in frames)
        with self._stats_cv:
            self._stats.sent_bytes[to] += nbytes
            self._stats.sent_messages += 1
            self._stats_cv.notify_all()


    def _receive(self, sock: zmq.Socket[Any], *, routed: bool, via: str | None = None) -> None:
        # Drain what is ready without starving the other sockets.
        for _ in range(64):
            try:
                frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            route: bytes | None = None
            if routed:
                route = frames[0].bytes
                frames = frames[1:]
            self._accept(frames, route, via)

    def _sender_proven(self, sender: str, first: zmq.Frame, via: str | None) -> bool:
        """Closed swarm: the header's sender is the peer the CURVE handshake proved, not another member.

        On our outbox to ``via`` only ``via`` answers (we checked its server key). On the inbox,
        a sender whose key we know must be the client key ZAP admitted (libzmq's User-Id); a
        sender we know no key for was admitted by the allow-list and claims nobody we talk to.
        """
        if via is not None:
            return sender == via
        remote = self._remotes.get(sender)
        if remote is None or remote.server_key is None:
            return True
        try:
            user = first.get("User-Id")
        except zmq.ZMQError:
            return False
        return isinstance(user, str) and user.encode() == remote.server_key

    def _accept(self, frames: list[zmq.Frame], route: bytes | None, via: str | None = None,
                relayed_from: str | None = None, first: zmq.Frame | None = None) -> None:
        """Check and file (or serve) one inbound message. ``first``: the received frame whose properties
        (CURVE User-Id, peer address) stand for the message's, when ``frames`` were reassembled from a stripe."""
        sender = "?"
        first = frames[0] if first is None else first
        try:
            check_frame_count(len(frames), self._limits)
            header = unpack_header(frames[0].buffer, self._limits)
            sender = header.sender
            if relayed_from is not None:
                if sender != relayed_from or header.kind in (HELLO, RELAY, RELAYED, STRIPE):
                    self._count_drop("AuthenticationError", sender, f"relay {via} named {relayed_from!r} as the "
                                     "sender of another peer's message (or nested a relay)")
                    return
            elif self.config.curve is not None and not self._sender_proven(sender, first, via):
                self._count_drop("AuthenticationError", sender, "the header names a peer other than the one "
                                 "whose CURVE key sent it")
                return
            if header.kind == STRIPE and relayed_from is None:
                done = self._stripes.add(sender, header.meta, frames[1:], time.monotonic(),
                                         route=route, via=via, first=first)
                if done is not None:
                    with self._stats_cv:
                        self._stats.striped_recv += 1
                    whole = [zmq.Frame(done.header), *(zmq.Frame(b, copy=False) for b in done.buffers)]
                    self._accept(whole, done.route, done.via, first=done.first)
                return
            if route is not None and relayed_from is None and self._learn_route(sender, route, first):
                self._new_routes.add(sender)
            if header.kind == HELLO:
                return
            if header.kind == RELAY:
                self._relay(sender, header, frames[1:])
                return
            if header.kind == RELAYED:
                origin_peer = header.meta.get("from")
                if not isinstance(origin_peer, str) or via is None and route is None:
                    raise ProtocolError("a relayed message must name its sender")
                self._accept(frames[1:], None, via=via or sender, relayed_from=origin_peer)
                return
            tensors = split_tensors(header, [f.buffer for f in frames[1:]], self._limits)
            if not self._fresh(header):
                raise StaleMessageError(f"message for job {header.job!r} plan {header.plan}")
            job, min_plan, _ = self._context
            if header.plan > min_plan and header.job == job and self._on_newer_plan is not None:
                self._on_newer_plan()
        except ProtocolError as e:
            self._drop(e, sender)
            return
        nbytes = sum(t.nbytes for t in tensors) + frames[0].buffer.nbytes
        with self._stats_cv:
            self._stats.recv_bytes[sender] += nbytes
            self._stats.recv_messages += 1
            if STAMP in header.meta:
                self._meter.arrived(sender, header.meta[STAMP], nbytes)
            self._stats_cv.notify_all()
        origin: str | None = None
        if route is not None and header.kind in self._origin_handlers:
            try:
                address = first.get("Peer-Address")
            except zmq.ZMQError:
                address = None
            origin = address if isinstance(address, str) else None
        item = _Inbound(header, tensors, nbytes, route, via, origin, relayed_from)
        if header.rpc is not None and not header.rpc.get("reply"):
            handler = self._handlers.get(header.kind)
            if handler is None or (route is None and via is None):
                self._count_drop("NoHandler", sender, header.kind)
                return
            self._pool.submit(self._handle, handler, item)
            return
        self._file(item)

    def _handle(self, handler: Handler, item: _Inbound) -> None:
        try:
            request = msgcodec.decode(item.header, item.tensors)
        except ProtocolError as e:
            self._drop(e, item.header.sender)
            return
        try:
            with_origin = self._origin_handlers.get(item.header.kind)
            reply = handler(request) if with_origin is None else with_origin(request, item.origin)
        except ProtocolError as e:
            self._drop(e, item.header.sender)
            return
        except Exception:  # a handler bug must not take the endpoint down
            logger.exception("handler for %s failed", item.header.kind)
            return
        if reply is None or (item.route is None and item.via is None):
            return
        assert item.header.rpc is not None
        frames = msgcodec.encode(reply, sender=self.peer_id, rpc={"id": item.header.rpc["id"], "reply": True})
        if item.relayed_from is not None:
            self._command(("reply_relayed", item.relayed_from, item.via, frames))
        elif item.route is not None:
            self._command(("reply", item.route, frames, item.header.sender))
        else:
            self._command(("reply_via", item.via, frames))
