"""One-way delay for every packet between region namespaces: a TUN device in the router (root). EMULATION ONLY.

The kernel here has no ``netem``, so :mod:`geotrain.emulate.netns` can shape
bandwidth (``htb`` on each region's ``eth0``) but cannot delay packets. This
module adds the delay *below* every program, so gloo, hivemind and geotrain
pay the same one:

- the *delay process* (``python -m geotrain.emulate.delay``, run inside the
  router namespace ``gt-<tag>-rt``) opens a TUN device (``gtdly``, layer 3, no
  packet-info header);
- policy routing in the router sends every packet that arrives from a region's
  veth (``iif r<k>``) to table 100, whose only route is ``default dev gtdly``: the
  packet is handed to the process instead of being forwarded;
- the process reads the IPv4 header's source and destination, looks up the
  *one-way delay* of that region pair (half the scenario link's RTT), holds
  the packet until ``arrival + delay`` and writes it back into ``gtdly``; the
  kernel then sees it arrive on ``gtdly`` (no ``iif r<k>`` rule matches) and
  forwards it by the main table to the destination's veth.

Packets are held in arrival order per region pair (the delay of a pair is one
constant), so byte order, TCP half-close, ICMP and UDP all pass unchanged:
the layer does not know about connections at all. Bandwidth stays with htb
on the sender's side (serialization first, then propagation, as on a real
link); the kernel's htb counters still count every byte. Table 100 also holds
an ``unreachable`` route of higher metric, so if the delay process dies the
regions are cut off (a loud failure) rather than silently undelayed.

Packets to the router's own addresses are delivered locally (the ``local``
table is consulted before rule 100) and are not delayed.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import heapq
import json
import logging
import math
import os
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from geotrain.emulate.commands import EmulationConfig
from geotrain.errors import ConfigError, EmulationError

logger = logging.getLogger(__name__)

TUN_NAME = "gtdly"
ROUTE_TABLE = 100
RULE_PRIORITY = 1000
READY_TIMEOUT_S = 15.0
# ioctl and flags of linux/if_tun.h
TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MAX_PACKET = 65535
MAX_HELD = 200_000  # packets held at once; beyond it new ones are dropped (TCP retransmits, as on a full queue)


@dataclass(frozen=True, kw_only=True)
class DelayConfig:
    """Which packets wait how long: ``delays_s[(src k, dst k)]`` for region numbers k (1-based, scenario order).

    A packet whose source is in ``<subnet_prefix>.<src k>.0/24`` and destination in
    ``<subnet_prefix>.<dst k>.0/24`` is held ``delays_s[(src k, dst k)]`` seconds (its
    *one-way delay*); a pair without an entry passes at once. ``router_ns``: the
    namespace the delay process runs in; ``ifaces``: the router's veths
    (``r1``, ``r2``, ...) whose incoming packets are delayed.
    """

    subnet_prefix: str
    router_ns: str
    ifaces: tuple[str, ...]
    delays_s: Mapping[tuple[int, int], float] = field(default_factory=dict)
    tun: str = TUN_NAME

    def __post_init__(self) -> None:
        for key, d in self.delays_s.items():
            if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, int) and 0 < k < 256 for k in key)):
                raise ConfigError(f"delay keys must be (src region number, dst region number) in 1..255; got {key!r}")
            if not (math.isfinite(d) and 0 <= d <= 10.0):
                raise ConfigError(f"one-way delay {key} must be 0..10 s; got {d}")
        if not self.ifaces:
            raise ConfigError("delay.ifaces must name the router's region veths (r1, r2, ...)")

    @classmethod
    def from_emulation(cls, config: EmulationConfig) -> DelayConfig:
        """Delays of an emulation's scenario: each linked region pair's RTT / 2, both directions."""
        regions = config.topology.regions
        delays: dict[tuple[int, int], float] = {}
        for i, a in enumerate(regions, start=1):
            for j, b in enumerate(regions, start=1):
                link = config.topology.link(a, b) if a != b else None
                if link is not None and link.one_way_delay_s > 0:
                    delays[(i, j)] = link.one_way_delay_s
        return cls(subnet_prefix=config.subnet_prefix, router_ns=config.router_ns,
                   ifaces=tuple(f"r{k}" for k in range(1, len(regions) + 1)), delays_s=delays)

    def to_json(self) -> str:
        return json.dumps({"subnet_prefix": self.subnet_prefix, "router_ns": self.router_ns, "ifaces": list(self.ifaces),
                           "tun": self.tun, "delays_s": [[a, b, d] for (a, b), d in sorted(self.delays_s.items())]})

    @classmethod
    def from_json(cls, text: str) -> DelayConfig:
        raw = json.loads(text)
        return cls(subnet_prefix=raw["subnet_prefix"], router_ns=raw["router_ns"], ifaces=tuple(raw["ifaces"]),
                   tun=raw["tun"], delays_s={(int(a), int(b)): float(d) for a, b, d in raw["delays_s"]})

    def delay_of(self, packet: bytes | memoryview) -> float:
        """One-way delay of an IPv4 ``packet`` (seconds; 0 when not between two delayed regions)."""
        if len(packet) < 20 or packet[0] >> 4 != 4:
            return 0.0
        return self._table().get((packet[12], packet[13], packet[14], packet[16], packet[17], packet[18]), 0.0)

    def _table(self) -> dict[tuple[int, int, int, int, int, int], float]:
        # (src octets 1-3, dst octets 1-3) -> delay; built once per config (frozen, so cache on the instance)
        cached: dict[tuple[int, int, int, int, int, int], float] | None = self.__dict__.get("_cache")
        if cached is None:
            a, b = (int(x) for x in self.subnet_prefix.split("."))
            cached = {(a, b, s, a, b, d): v for (s, d), v in self.delays_s.items()}
            object.__setattr__(self, "_cache", cached)
        return cached


def route_commands(config: DelayConfig) -> list[list[str]]:
    """Commands, run inside the router namespace once ``config.tun`` exists, that steer region traffic through it."""
    tun, table = config.tun, str(ROUTE_TABLE)
    cmds: list[list[str]] = [
        ["ip", "link", "set", tun, "up"],
        ["sysctl", "-q", "-w", "net.ipv4.conf.all.rp_filter=0"],
        ["sysctl", "-q", "-w", f"net.ipv4.conf.{tun}.rp_filter=0"],
        ["ip", "route", "add", "default", "dev", tun, "table", table],
        # if the delay process (and with it the device) is gone, fail closed
        ["ip", "route", "add", "unreachable", "default", "metric", "4096", "table", table],
    ]
    for iface in config.ifaces:
        cmds.append(["ip", "rule", "add", "iif", iface, "lookup", table, "priority", str(RULE_PRIORITY)])
    return cmds


def open_tun(name: str) -> int:
    """Open (create) TUN device ``name`` in this process's network namespace; return its file descriptor."""
    try:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise EmulationError(
            f"cannot open /dev/net/tun ({e.strerror}): the delay layer needs the tun module and root"
        ) from None
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError as e:
        os.close(fd)
        raise EmulationError(f"cannot create TUN device {name!r}: {e.strerror}") from None
    os.set_blocking(fd, False)
    return fd


class DelayLoop:
    """Holds packets read from a TUN device for their one-way delay, then writes them back (one thread).

    A *held packet* is ``(release time, sequence, bytes)`` in one heap: the
    sequence number keeps packets of equal release time in arrival order.
    """

    def __init__(self, config: DelayConfig, fd: int) -> None:
        self.config, self.fd = config, fd
        self._held: list[tuple[float, int, bytes]] = []
        self._seq = 0
        self.forwarded = 0
        self.dropped = 0
        self._stop = False

    def stop(self) -> None:
        self._stop = True

    def run(self) -> None:
        clock = time.monotonic
        held = self._held
        while not self._stop:
            now = clock()
            blocked = False
            while held and held[0][0] <= now:
                try:
                    os.write(self.fd, held[0][2])
                except BlockingIOError:
                    blocked = True  # device queue full: wait until it is writable, keep the packet first in line
                    break
                except OSError as e:  # a packet the kernel refuses (e.g. malformed) is dropped, as a router would
                    logger.debug("dropped a packet: %s", e)
                    self.dropped += 1
                else:
                    self.forwarded += 1
                heapq.heappop(held)
            timeout = 0.5 if not held else max(0.0, held[0][0] - clock())
            ready, _, _ = select.select([self.fd], [self.fd] if blocked else [], [], 0.5 if blocked else timeout)
            if self.fd not in ready:
                continue
            now = clock()
            while True:
                try:
                    pkt = os.read(self.fd, MAX_PACKET)
                except BlockingIOError:
                    break
                if len(held) >= MAX_HELD:
                    self.dropped += 1
                    continue
                self._seq += 1
                heapq.heappush(held, (now + self.config.delay_of(pkt), self._seq, pkt))


class DelayLayer:
    """The delay process of one emulation, started in its router namespace; a context manager.

    ``start()`` returns once the device exists and the routes point at it (the
    process prints ``{"event": "ready"}``); ``close()`` ends the process, which
    removes the device and, with the ``unreachable`` fallback, leaves the
    regions disconnected until the emulation is torn down.
    """

    def __init__(self, config: DelayConfig) -> None:
        self.config = config
        self._proc: subprocess.Popen[str] | None = None

    @property
    def method(self) -> str:
        return "tun: userspace per-packet one-way delay in the router namespace (geotrain.emulate.delay)"

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> DelayLayer:
        argv = ["ip", "netns", "exec", self.config.router_ns, sys.executable, "-m", "geotrain.emulate.delay",
                "--config", self.config.to_json()]
        self._proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                      text=True, start_new_session=True)
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
        line = self._proc.stdout.readline() if ready else ""
        if not line.startswith("{") or json.loads(line).get("event") != "ready":
            err = self._stderr_tail()
            self.close()
            raise EmulationError(f"the delay process did not come up within {timeout_s}s: {line.strip()} {err}")
        logger.info("delay layer up in %s: %s", self.config.router_ns, line.strip())
        return self

    def _stderr_tail(self) -> str:
        if self._proc is None or self._proc.poll() is None or self._proc.stderr is None:
            return ""
        return self._proc.stderr.read()[-800:]

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

    def __enter__(self) -> DelayLayer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _run(argv: Sequence[str]) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=15, check=False)
    if done.returncode != 0:
        raise EmulationError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    """The delay process: run inside the router namespace (``ip netns exec gt-<tag>-rt``)."""
    p = argparse.ArgumentParser(prog="python -m geotrain.emulate.delay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="DelayConfig as JSON (DelayConfig.to_json)")
    args = p.parse_args(argv)
    config = DelayConfig.from_json(args.config)
    fd = open_tun(config.tun)
    for cmd in route_commands(config):
        _run(cmd)
    loop = DelayLoop(config, fd)

    def _term(signum: int, frame: Any) -> None:
        loop.stop()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(10))  # packets should not wait on training for a core
    print(json.dumps({"event": "ready", "tun": config.tun, "pairs": len(config.delays_s)}), flush=True)
    loop.run()
    print(json.dumps({"event": "done", "forwarded": loop.forwarded, "dropped": loop.dropped}), flush=True)
    os.close(fd)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
