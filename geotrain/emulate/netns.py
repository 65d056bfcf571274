"""Regions as Linux network namespaces with shaped links between them (root only).

An *emulation* is a set of namespaces named ``gt-<tag>-*``: one per region
plus a router, laid out as in :mod:`geotrain.emulate.commands`. It lives in the
kernel, not in this process: :meth:`Emulation.setup` builds it and
:meth:`Emulation.teardown` (or :func:`cleanup`) removes it. Because a crash can
skip teardown, :meth:`Emulation.setup` first deletes any namespaces left
under the same tag, so the next run starts clean.

Delay is not emulated here (the kernel lacks ``netem``); add it below every
program with :class:`geotrain.emulate.delay.DelayLayer`, or in geotrain's
transport only with :class:`geotrain.emulate.links.LinkEmulator`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from geotrain.emulate.commands import (
    NS_PREFIX,
    REGION_IFACE,
    ROUTER,
    EmulationConfig,
    rate_commands,
    setup_commands,
)
from geotrain.emulate.nsenter import entered, socket_in
from geotrain.errors import EmulationError

logger = logging.getLogger(__name__)

COMMAND_TIMEOUT_S = 15.0


def check_privileges() -> None:
    """Raise :class:`EmulationError` unless we are root and ``ip``/``tc`` exist."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise EmulationError(f"network emulation needs {' and '.join(missing)} (install iproute2)")
    if os.geteuid() != 0:
        raise EmulationError(
            "network emulation needs root (it creates network namespaces); run with sudo, "
            "or emulate delay and bandwidth in-process with LinkEmulator(shape_bandwidth=True)"
        )


def _run(argv: Sequence[str], *, timeout: float = COMMAND_TIMEOUT_S) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise EmulationError(f"{' '.join(argv)} did not finish within {timeout}s") from None
    except OSError as e:
        raise EmulationError(f"cannot run {argv[0]}: {e.strerror}") from None
    if done.returncode != 0:
        raise EmulationError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def list_namespaces(prefix: str = NS_PREFIX) -> list[str]:
    """Named network namespaces whose name starts with ``prefix``."""
    out = _run(["ip", "netns", "list"])
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(prefix))


def _end_processes_in(names: Sequence[str], grace_s: float = 3.0) -> int:
    """SIGTERM every process inside the namespaces ``names``, SIGKILL what is left after ``grace_s``.

    Only processes in this emulation's own namespaces are touched: they were
    started there by it, or by a user into it, and would otherwise outlive it.
    """
    pids: set[int] = set()
    for name in names:
        pids.update(int(p) for p in _run(["ip", "netns", "pids", name]).split() if p.isdigit())
    pids.discard(os.getpid())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    left = set(pids)
    while left and time.monotonic() < deadline:
        left = {p for p in left if _alive(p)}
        if left:
            time.sleep(0.05)  # polling other processes' exit: there is no event to wait on
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0) but has ended; reaping it is its parent's business (Popen.wait)
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cleanup(tag: str) -> list[str]:
    """End processes inside and delete every ``gt-<tag>-*`` namespace (veths go with them); return their names."""
    check_privileges()
    if not re.match(r"^[a-z0-9]{1,12}$", tag):
        raise EmulationError(f"tag must be 1-12 lowercase letters or digits; got {tag!r}")
    names = list_namespaces(f"{NS_PREFIX}{tag}-")
    ended = _end_processes_in(names) if names else 0
    for name in names:
        _run(["ip", "netns", "del", name])
    if names:
        logger.info("removed namespaces %s (ended %d processes inside)", names, ended)
    return names


class Emulation:
    """Regions of a scenario as network namespaces with shaped links; a context manager.

    ``address(region)`` is where that region's peers bind; ``run_in(region, argv)``
    starts a process in that region; ``socket(region)`` opens a socket there
    from this process. Processes started with ``run_in`` are ended on teardown.
    """

    def __init__(self, config: EmulationConfig) -> None:
        self.config = config
        self._procs: list[subprocess.Popen[Any]] = []
        self._up = False

    # -- lifecycle ------------------------------------------------------------------------------------
    def setup(self) -> Emulation:
        """Remove stale ``gt-<tag>-*`` namespaces, then build this emulation. Undoes itself on failure."""
        check_privileges()
        stale = cleanup(self.config.tag)
        if stale:
            logger.warning("removed %d stale namespaces of tag %r from an earlier run", len(stale), self.config.tag)
        built = False
        try:
            for argv in setup_commands(self.config):
                _run(argv)
            built = True
        finally:
            if not built:  # a half-built emulation would confuse the next run; undo it, keep the error
                cleanup(self.config.tag)
        self._up = True
        logger.info("emulation %r up: %s", self.config.tag, self.addresses())
        return self

    def teardown(self) -> list[str]:
        """End processes started with :meth:`run_in` and delete every namespace of the tag."""
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self._procs.clear()
        self._up = False
        return cleanup(self.config.tag)

    def __enter__(self) -> Emulation:
        return self.setup()

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def set_rate(self, src: str, dst: str, rate_bps: float) -> None:
        """Reshape the link ``src -> dst`` to ``rate_bps`` bytes/s now, under running traffic (degrade or restore
        it; ``config.rate_bps(src, dst)`` is its built rate)."""
        if not self._up:
            raise EmulationError("emulation is not up; call setup() or use it as a context manager")
        for argv in rate_commands(self.config, src, dst, rate_bps):
            _run(argv)

    # -- where things are -----------------------------------------------------------------------------
    def namespace(self, region: str) -> str:
        return self.config.namespace(region)

    def address(self, region: str) -> str:
        """The region's host address (inside its namespace only)."""
        return self.config.address(region)

    def addresses(self) -> dict[str, str]:
        return {r: self.config.address(r) for r in self.config.topology.regions}

    def exec_prefix(self, region: str) -> list[str]:
        """Prefix an argv with this to run it inside ``region``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(region)]

    # -- doing things inside a region -----------------------------------------------------------------
    def run_in(self, region: str, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``region``'s namespace; it is ended (its process group) on teardown."""
        if not self._up:
            raise EmulationError("emulation is not up; call setup() or use it as a context manager")
        popen_kwargs.setdefault("start_new_session", True)  # so teardown can end the whole group
        popen_kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc: subprocess.Popen[Any] = subprocess.Popen([*self.exec_prefix(region), *argv], **popen_kwargs)
        self._procs.append(proc)
        return proc

    def inside(self, region: str) -> contextlib.AbstractContextManager[None]:
        """Run a block with the calling thread in ``region``'s namespace.

        Sockets, threads and ZMQ contexts' I/O threads created inside the block
        stay in that namespace for life, e.g. ``with em.inside("eu"):
        Transport(TransportConfig(host=em.address("eu")), ...).start()``.
        """
        return entered(self.namespace(region))

    def socket(self, region: str, family: int = socket.AF_INET, type: int = socket.SOCK_STREAM) -> socket.socket:
        """A socket in ``region``'s namespace, created from this process."""
        return socket_in(self.namespace(region), family, type)

    def describe(self) -> dict[str, Any]:
        """JSON-ready picture of the configured emulation: namespaces, addresses, shaped rates."""
        cfg = self.config
        regions = cfg.topology.regions
        links = []
        for src in regions:
            for dst in regions:
                if src == dst:
                    continue
                rate = cfg.rate_bps(src, dst)
                link = cfg.topology.link(src, dst)
                links.append({
                    "src": src,
                    "dst": dst,
                    "rate_mbps": None if rate is None else round(rate * 8 / 1e6, 3),
                    "one_way_delay_ms": None if link is None else round(link.one_way_delay_s * 1e3, 3),
                    "reachable": rate is not None,
                })  # fmt: skip
        return {
            "tag": cfg.tag,
            "scale": cfg.scale,
            "router": cfg.router_ns,
            "regions": {r: {"netns": cfg.namespace(r), "address": cfg.address(r)} for r in regions},
            "links": links,
        }


_CLASS_RE = re.compile(r"^class htb 1:([0-9a-f]+) .*?\brate (\S+)")
_SENT_RE = re.compile(r"^\s*Sent (\d+) bytes (\d+) pkt")


def status(tag: str) -> dict[str, Any]:
    """What the kernel holds for ``tag``: namespaces, host addresses, htb classes with bytes sent.

    Read from the system (not from a scenario), so it also describes an
    emulation left by another process.
    """
    check_privileges()
    prefix = f"{NS_PREFIX}{tag}-"
    names = list_namespaces(prefix)
    regions: dict[str, Any] = {}
    subnet_owner: dict[int, str] = {}  # third address octet -> region
    for ns in names:
        region = ns[len(prefix):]
        if region == ROUTER:
            continue
        addrs = json.loads(_run(["ip", "-n", ns, "-j", "addr", "show", "dev", REGION_IFACE]) or "[]")
        address = next(
            (a["local"] for item in addrs for a in item.get("addr_info", []) if a.get("family") == "inet"), None
        )
        regions[region] = {"netns": ns, "address": address, "egress": {}}
        if address:
            subnet_owner[int(address.split(".")[2])] = region
    for info in regions.values():
        classes = _run(["tc", "-n", info["netns"], "-s", "class", "show", "dev", REGION_IFACE])
        current: dict[str, Any] | None = None
        for line in classes.splitlines():
            m = _CLASS_RE.match(line)
            if m:
                minor = int(m.group(1), 16)
                dst = subnet_owner.get(minor - 0x10) if minor >= 0x10 else None
                current = {"rate": m.group(2), "sent_bytes": 0}
                if dst is not None:
                    info["egress"][dst] = current
                continue
            s = _SENT_RE.match(line)
            if s and current is not None:
                current["sent_bytes"] = int(s.group(1))
                current = None
    return {"tag": tag, "up": bool(names), "router": f"{prefix}{ROUTER}" in names, "regions": regions}
