"""A small fault-injecting TCP proxy, for tests of the data plane under broken links.

What is it? A listener on ``127.0.0.1:0`` that forwards every connection to one
target address, byte for byte, and can be told to break the link in one of
four ways (a :class:`Fault`):

- ``pass``: forward everything (the default);
- ``reset``: after ``after_bytes`` bytes went through in the watched direction,
  send a TCP reset (RST) both ways, mid-message if that is where the count
  ends. Fires once; later connections pass (a reconnecting peer gets through);
- ``blackhole``: after ``after_bytes`` bytes, keep the connections open but
  silently swallow every further byte both ways (a dead route, not a dead peer);
- ``rate``: cap the watched direction at ``rate_bytes_per_s`` (a slow link).

"Watched direction": ``up`` is client -> target (what a ZMQ DEALER that
connects through the proxy sends), ``down`` is target -> client (replies, e.g.
a state transfer served from the target), ``both`` counts both together.

Point a peer at :attr:`FaultProxy.address` instead of the real endpoint; change
the fault at any time with :meth:`FaultProxy.set_fault` (counters restart);
wait for a fault to act with :meth:`FaultProxy.wait_fired`. Loopback only:
the proxy is a test seam, not a network emulator (see :mod:`geotrain.emulate`).
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

from geotrain.errors import ConfigError

__all__ = ["Fault", "FaultProxy", "FaultProxyConfig", "ProxyStats"]

logger = logging.getLogger(__name__)

FaultKind = Literal["pass", "reset", "blackhole", "rate"]
Direction = Literal["up", "down", "both"]
_CHUNK = 64 * 1024


@dataclass(frozen=True, kw_only=True)
class Fault:
    """What to do to the link; see the module docstring for each ``kind``."""

    kind: FaultKind = "pass"
    after_bytes: int = 0
    rate_bytes_per_s: float | None = None
    direction: Direction = "up"

    def __post_init__(self) -> None:
        if self.kind not in ("pass", "reset", "blackhole", "rate"):
            raise ConfigError(f"fault.kind must be pass, reset, blackhole or rate; got {self.kind!r}")
        if self.direction not in ("up", "down", "both"):
            raise ConfigError(f"fault.direction must be up, down or both; got {self.direction!r}")
        if type(self.after_bytes) is not int or self.after_bytes < 0:
            raise ConfigError(f"fault.after_bytes must be an integer >= 0; got {self.after_bytes!r}")
        if self.kind == "rate" and not (self.rate_bytes_per_s is not None and self.rate_bytes_per_s > 0):
            raise ConfigError("fault.kind 'rate' needs rate_bytes_per_s > 0 (bytes per second)")


@dataclass(frozen=True, kw_only=True)
class FaultProxyConfig:
    """``target``: ``tcp://host:port`` (or ``host:port``) to forward to; ``io_timeout_s`` bounds every send.

    ``capture_bytes``: keep up to this many forwarded bytes per direction (a
    loopback capture, e.g. to check that a payload never crosses in clear).
    """

    target: str
    host: str = "127.0.0.1"
    fault: Fault = field(default_factory=Fault)
    io_timeout_s: float = 30.0
    connect_timeout_s: float = 5.0
    capture_bytes: int = 0

    def __post_init__(self) -> None:
        try:
            _split_target(self.target)
        except ValueError as e:
            raise ConfigError(f"faultproxy.target must be tcp://host:port; got {self.target!r} ({e})") from None
        if self.io_timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise ConfigError("faultproxy.io_timeout_s and connect_timeout_s must be > 0")
        if self.capture_bytes < 0:
            raise ConfigError(f"faultproxy.capture_bytes must be >= 0; got {self.capture_bytes}")


@dataclass
class ProxyStats:
    """Bytes forwarded per direction since the last :meth:`FaultProxy.set_fault`, and what the faults did."""

    up: int = 0
    down: int = 0
    swallowed: int = 0
    connections: int = 0
    resets: int = 0
    fired_at: int | None = None  # bytes seen in the watched direction when the fault acted


def _split_target(target: str) -> tuple[str, int]:
    rest = target.removeprefix("tcp://")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected host:port")
    return host, int(port)


class _Conn:
    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self.closed = threading.Event()
        self.lock = threading.Lock()
        self.open_pumps = 2

    def reset(self) -> None:
        # SO_LINGER on with a zero timeout: close() sends RST instead of FIN
        for s in (self.client, self.server):
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        self.close()

    def close(self) -> None:
        with self.lock:
            if self.closed.is_set():
                return
            self.closed.set()
            for s in (self.client, self.server):
                try:
                    s.close()
                except OSError:
                    pass


class FaultProxy:
    """A TCP proxy with one switchable :class:`Fault`. Use as a context manager, or ``start()``/``close()``."""

    def __init__(self, config: FaultProxyConfig) -> None:
        self.config = config
        self._target = _split_target(config.target)
        self._fault = config.fault
        self._lock = threading.Lock()
        self._connected = threading.Condition(self._lock)  # notified on each accepted connection
        self._stats = ProxyStats()
        self._fired = threading.Event()
        self._next_free = 0.0  # rate cap: when the watched direction may send again (monotonic)
        self._conns: set[_Conn] = set()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._captured: dict[str, bytearray] = {"up": bytearray(), "down": bytearray()}

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.config.host, 0))
        sock.listen(64)
        self._listener = sock
        t = threading.Thread(target=self._accept_loop, name="gt-faultproxy", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    @property
    def address(self) -> str:
        """Where clients connect instead of the target, ``tcp://127.0.0.1:PORT``."""
        if self._listener is None:
            raise RuntimeError("fault proxy not started")
        host, port = self._listener.getsockname()[:2]
        return f"tcp://{host}:{port}"

    def close(self) -> None:
        self._stop.set()
        if self._listener is not None:
            try:
                self._listener.close()
            except OSError:
                pass
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            c.close()
        for t in list(self._threads):
            t.join(timeout=5.0)

    def __enter__(self) -> FaultProxy:
        return self.start() if self._listener is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- control ------------------------------------------------------------------------------------
    def set_fault(self, fault: Fault) -> None:
        """Switch to ``fault`` for the bytes that follow; counters restart from zero."""
        with self._lock:
            self._fault = fault
            self._stats = ProxyStats(connections=self._stats.connections)
            self._fired.clear()
            self._next_free = 0.0

    @property
    def fault(self) -> Fault:
        return self._fault

    @property
    def stats(self) -> ProxyStats:
        with self._lock:
            s = self._stats
            return ProxyStats(s.up, s.down, s.swallowed, s.connections, s.resets, s.fired_at)

    def captured(self, direction: Literal["up", "down"]) -> bytes:
        """The first ``config.capture_bytes`` bytes forwarded in ``direction`` (all connections, in order)."""
        with self._lock:
            return bytes(self._captured[direction])

    def wait_fired(self, timeout: float) -> bool:
        """True once the current reset/blackhole fault has acted (within ``timeout`` seconds)."""
        return self._fired.wait(timeout)

    def wait_connections(self, n: int, timeout: float) -> int:
        """Block until the proxy has accepted ``n`` connections in all (a reconnect after a fault is one more);
        the count. TimeoutError after ``timeout`` seconds."""
        with self._connected:
            if not self._connected.wait_for(lambda: self._stats.connections >= n, timeout):
                raise TimeoutError(f"{self._stats.connections} of {n} connections within {timeout}s")
            return self._stats.connections

    def reset_all(self) -> int:
        """Reset every open connection now; returns how many."""
        with self._lock:
            conns = list(self._conns)
            self._stats.resets += len(conns)
        for c in conns:
            c.reset()
        return len(conns)

    # -- internals ----------------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._listener], [], [], 0.2)
                if not ready:
                    continue
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._target, timeout=self.config.connect_timeout_s)
            except OSError as e:
                logger.info("fault proxy: target %s unreachable: %s", self.config.target, e)
                client.close()
                continue
            for s in (client, server):
                s.settimeout(self.config.io_timeout_s)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(client, server)
            with self._lock:
                self._conns.add(conn)
                self._stats.connections += 1
                self._connected.notify_all()
            for src, dst, d in ((client, server, "up"), (server, client, "down")):
                t = threading.Thread(target=self._pump, args=(conn, src, dst, d), daemon=True, name=f"gt-proxy-{d}")
                t.start()
                self._threads.append(t)
            self._threads = [t for t in self._threads if t.is_alive()]

    def _pump(self, conn: _Conn, src: socket.socket, dst: socket.socket, direction: str) -> None:
        try:
            while not conn.closed.is_set() and not self._stop.is_set():
                ready, _, _ = select.select([src], [], [], 0.2)
                if not ready:
                    continue
                data = src.recv(self._chunk(direction))
                if not data:
                    dst.shutdown(socket.SHUT_WR)  # pass the half-close on
                    break
                self._forward(conn, dst, direction, data)
        except (OSError, ValueError):
            pass  # the other pump (or a fault) closed the connection
        finally:
            with conn.lock:
                conn.open_pumps -= 1
                last = conn.open_pumps == 0
            if last or conn.closed.is_set():
                conn.close()
                with self._lock:
                    self._conns.discard(conn)

    def _chunk(self, direction: str) -> int:
        f = self._fault
        if f.kind == "rate" and self._watched(f, direction):
            assert f.rate_bytes_per_s is not None
            return max(1, min(_CHUNK, int(f.rate_bytes_per_s / 50)))  # about 20 ms of the cap per chunk
        return _CHUNK

    @staticmethod
    def _watched(f: Fault, direction: str) -> bool:
        return f.direction == "both" or f.direction == direction

    def _forward(self, conn: _Conn, dst: socket.socket, direction: str, data: bytes) -> None:
        with self._lock:
            f = self._fault
            watched = self._watched(f, direction)
            if f.kind == "blackhole" and self._fired.is_set():
                self._stats.swallowed += len(data)
                return
            seen = self._stats.up + self._stats.down if f.direction == "both" else getattr(self._stats, direction)
            keep = len(data)
            fire = False
            if f.kind in ("reset", "blackhole") and watched and not self._fired.is_set():
                room = max(0, f.after_bytes - seen)
                if room < len(data):
                    keep, fire = room, True
            wait = 0.0
            if f.kind == "rate" and watched:
                assert f.rate_bytes_per_s is not None
                now = time.monotonic()
                start = max(now, self._next_free)
                self._next_free = start + len(data) / f.rate_bytes_per_s
                wait = start - now
            if direction == "up":
                self._stats.up += keep
            else:
                self._stats.down += keep
            room_left = self.config.capture_bytes - len(self._captured[direction])
            if room_left > 0:
                self._captured[direction] += data[: min(keep, room_left)]
        if wait > 0:
            time.sleep(wait)  # the emulated link is busy: hold the bytes (this is the proxy, not a test)
        if keep:
            dst.sendall(data[:keep])
        if not fire:
            return
        with self._lock:
            self._fired.set()
            self._stats.fired_at = seen + keep
            if f.kind == "reset":
                self._stats.resets += 1
                self._fault = Fault()  # one-shot: a reconnecting peer gets through
            else:
                self._stats.swallowed += len(data) - keep
        if f.kind == "reset":
            logger.info("fault proxy: reset after %d bytes %s", f.after_bytes, f.direction)
            conn.reset()
        else:
            logger.info("fault proxy: blackholing after %d bytes %s", f.after_bytes, f.direction)
