"""Per-destination delay (and optional bandwidth) emulation for the data plane. EMULATION ONLY.

The kernel here has no ``netem``, so network namespaces can shape bandwidth
(``htb``) but cannot delay packets. :class:`LinkEmulator` adds the missing
one-way delay in geotrain's transport instead: before handing a message to
its socket, the transport asks ``before_send(dst_region, nbytes)`` how long
the message would still be on the wire, and delivers it that much later.

Model: each directed *path* (this peer's region -> a destination region) is a
FIFO link with a propagation delay ``d`` (half the scenario's RTT) and, for
the no-root fallback, a rate ``r`` bytes/s. A message of ``n`` bytes handed over
at time ``t`` starts when the link is free, ``s = max(t, free_at)``, leaves the
link at ``s + n / r`` (the next message starts no earlier) and arrives at
``s + n / r + d``. ``before_send`` returns ``arrival - t``. Arrival times to one
destination never decrease, so a transport can hold messages in one FIFO per
destination and release the head when its time comes; it must not sleep in the
sending thread, or messages would pay the delay one after another instead of
overlapping in flight as on a real link.

When the kernel already shapes bandwidth (namespaces, ``geotrain emulate up``),
build the emulator with ``shape_bandwidth=False`` so only the delay is added;
bandwidth would otherwise be counted twice.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from geotrain.emulate.topology import Topology
from geotrain.errors import ConfigError, EmulationError


class SendEmulator(Protocol):
    """What the transport calls before each send (emulation only)."""

    def before_send(self, dst_region: str, nbytes: int) -> float:
        """Seconds from now until the message should be handed to the socket."""
        ...


@dataclass(frozen=True, kw_only=True)
class LinkPath:
    """One directed path: one-way ``delay_s`` and optional ``bandwidth_bps`` (bytes/s; None = unlimited)."""

    delay_s: float
    bandwidth_bps: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.delay_s) and self.delay_s >= 0):
            raise ConfigError(f"emulate path delay_s must be a finite number >= 0; got {self.delay_s}")
        if self.bandwidth_bps is not None and not (math.isfinite(self.bandwidth_bps) and self.bandwidth_bps > 0):
            raise ConfigError(
                f"emulate path bandwidth_bps must be > 0 bytes/s, or None for unlimited; got {self.bandwidth_bps}"
            )


@dataclass(frozen=True, kw_only=True)
class LinkEmulatorConfig:
    """Paths out of ``local_region``: ``paths[(src, dst)]``; only ``src == local_region`` entries are used.

    A destination in the local region without an entry gets no delay; any other
    missing destination is an error at send time (the scenario lacks that link).
    """

    local_region: str
    paths: Mapping[tuple[str, str], LinkPath] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.local_region:
            raise ConfigError("emulate.local_region must name this peer's region; got ''")
        for key, path in self.paths.items():
            if not (isinstance(key, tuple) and len(key) == 2):
                raise ConfigError(f"emulate.paths keys must be (src_region, dst_region) pairs; got {key!r}")
            if not isinstance(path, LinkPath):
                raise ConfigError(f"emulate.paths[{key}] must be a LinkPath; got {type(path).__name__}")

    @classmethod
    def from_topology(
        cls, topology: Topology, local_region: str, *, scale: float = 1.0, shape_bandwidth: bool = False
    ) -> LinkEmulatorConfig:
        """Paths from a scenario: delay = RTT / 2; bandwidth / ``scale`` when ``shape_bandwidth``.

        ``scale`` is the same divisor ``geotrain emulate up --scale`` applies to
        the kernel's rates; delays are never scaled.
        """
        if local_region not in topology.regions:
            raise ConfigError(f"emulate.local_region {local_region!r} is not a scenario region {list(topology.regions)}")
        if not (math.isfinite(scale) and scale > 0):
            raise ConfigError(f"emulate scale must be a number > 0; got {scale}")
        paths: dict[tuple[str, str], LinkPath] = {}
        for dst in topology.regions:
            link = topology.link(local_region, dst)
            if link is None:
                continue
            bw = link.bandwidth_bps / scale if shape_bandwidth else None
            paths[(local_region, dst)] = LinkPath(delay_s=link.one_way_delay_s, bandwidth_bps=bw)
        return cls(local_region=local_region, paths=paths)


class LinkEmulator:
    """Tells the transport how long each outgoing message spends on its emulated link.

    Thread-safe. ``clock`` is injectable (seconds, monotonic) so tests get exact
    timings. See the module docstring for the FIFO model.
    """

    def __init__(self, config: LinkEmulatorConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        self._free_at: dict[str, float] = {}  # dst region -> when its link finishes serializing
        self._bytes: dict[str, int] = {}
        self._messages: dict[str, int] = {}

    def _path(self, dst_region: str) -> LinkPath:
        path = self.config.paths.get((self.config.local_region, dst_region))
        if path is not None:
            return path
        if dst_region == self.config.local_region:
            return LinkPath(delay_s=0.0)
        raise EmulationError(
            f"no emulated link {self.config.local_region} -> {dst_region}; add it to the scenario's links"
        )

    def delay_for(self, dst_region: str, nbytes: int) -> float:
        """Seconds a message of ``nbytes`` would take on an idle link: serialization + propagation.

        Pure: reserves nothing. Use :meth:`before_send` for messages actually sent.
        """
        if nbytes < 0:
            raise EmulationError(f"message size must be >= 0 bytes; got {nbytes}")
        path = self._path(dst_region)
        serialize = nbytes / path.bandwidth_bps if path.bandwidth_bps else 0.0
        return serialize + path.delay_s

    def before_send(self, dst_region: str, nbytes: int) -> float:
        """Reserve the link to ``dst_region`` for ``nbytes``; return seconds until the message arrives.

        Messages to one destination queue behind each other (FIFO): a message
        sent while the link still serializes an earlier one waits for it.
        """
        if nbytes < 0:
            raise EmulationError(f"message size must be >= 0 bytes; got {nbytes}")
        path = self._path(dst_region)
        with self._lock:
            now = self._clock()
            start = max(now, self._free_at.get(dst_region, now))
            done = start + (nbytes / path.bandwidth_bps if path.bandwidth_bps else 0.0)
            self._free_at[dst_region] = done
            self._bytes[dst_region] = self._bytes.get(dst_region, 0) + nbytes
            self._messages[dst_region] = self._messages.get(dst_region, 0) + 1
            return done + path.delay_s - now

    def stats(self) -> dict[str, dict[str, int]]:
        """Bytes and messages handed to each destination region so far."""
        with self._lock:
            return {d: {"bytes": self._bytes[d], "messages": self._messages[d]} for d in self._bytes}
