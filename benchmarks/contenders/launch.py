"""Processes of a contender, started inside emulated regions, and the kernel's byte counters.

A *network* is where the contenders' peers live:

- :class:`NetnsNetwork`: one Linux network namespace per region (``geotrain.emulate.Emulation``,
  htb bandwidth per region pair; root). Bytes are read from the kernel: the htb
  class of each (source region -> destination region) pair counts cross-region
  bytes, the ``lo`` device inside each region counts intra-region bytes. Every
  contender is counted the same way, headers, control plane and all.
- :class:`LoopbackNetwork`: everything on 127.0.0.1, nothing shaped by the kernel
  (no root). Contenders count their own bytes where they can.

:class:`Procs` starts ``python -m MODULE ...`` children in a region (their own
process group, stdin kept open for the start barrier), collects their JSON
lines, waits on events with timeouts and ends every child on close.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger(__name__)

COUNTER_TIMEOUT_S = 10.0


class Proc:
    """One child and the JSON events it printed so far."""

    def __init__(self, name: str, popen: subprocess.Popen[str]) -> None:
        self.name, self.popen = name, popen
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.lines: list[str] = []
        threading.Thread(target=self._pump, daemon=True, name=f"pump-{name}").start()

    def _pump(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            line = raw.strip()
            if not line:
                continue
            self.lines.append(line)
            if line.startswith("{"):
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(item, dict):
                    self.events.put(item)

    def next_event(self, timeout: float) -> dict[str, Any] | None:
        """The next JSON event, or None after ``timeout`` (raises if the child died with nothing left)."""
        try:
            item = self.events.get(timeout=timeout)
        except queue.Empty:
            if self.popen.poll() is not None and self.events.empty():
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode}; last output: {self.lines[-8:]}") from None
            return None
        self.seen.append(item)
        return item

    def wait_event(self, event: str, timeout: float) -> dict[str, Any]:
        """Block until the child prints ``{"event": event, ...}``; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            item = self.next_event(min(left, 0.5))
            if item is not None and item.get("event") == event:
                return item
        raise TimeoutError(f"{self.name}: no {event!r} event within {timeout:.0f}s; last output: {self.lines[-8:]}") from None

    def send(self, line: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(line + "\n")
        self.popen.stdin.flush()

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                pass


class Procs:
    """Starts children (in a region when the network has namespaces) and reaps them all on close."""

    def __init__(self, network: Network, *, stderr_dir: str | None = None) -> None:
        self.network = network
        self.children: list[Proc] = []
        self._stderr_dir = stderr_dir

    def start(self, name: str, module: str, args: Sequence[str], *, region: str,
              env: dict[str, str] | None = None) -> Proc:
        argv = [*self.network.exec_prefix(region), sys.executable, "-m", module, *args]
        stderr: Any = subprocess.DEVNULL
        if self._stderr_dir is not None:
            stderr = open(os.path.join(self._stderr_dir, f"{name}.stderr"), "w")  # noqa: SIM115 (closed below)
        try:
            popen = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.PIPE, text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.network.env(region), **(env or {})},
                start_new_session=True,  # its own process group: p2pd and friends end with it
            )
        finally:
            if stderr is not subprocess.DEVNULL:
                stderr.close()
        child = Proc(name, popen)
        self.children.append(child)
        return child

    def close(self, grace_s: float = 5.0) -> None:
        for c in self.children:
            c.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for c in self.children:
            try:
                c.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.signal(signal.SIGKILL)
                c.popen.wait(timeout=10)
            try:  # the group may still hold grandchildren (p2pd) after its leader exited
                os.killpg(c.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.children.clear()

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Network:
    """Where peers run. ``kernel_shaped``: the kernel shapes bandwidth between regions."""

    kernel_shaped = False
    bytes_method = "self-counted"

    def host(self, region: str) -> str:
        return "127.0.0.1"

    def exec_prefix(self, region: str) -> list[str]:
        return []

    def env(self, region: str) -> dict[str, str]:
        return {"GLOO_SOCKET_IFNAME": "lo"}

    def counters(self) -> dict[str, dict[str, int]] | None:
        """``{"cross": {"a->b": bytes}, "intra": {region: bytes}}`` from the kernel, or None."""
        return None

    def close(self) -> None:
        pass


class LoopbackNetwork(Network):
    """No root: every peer on loopback; the kernel neither shapes nor counts per region."""


class NetnsNetwork(Network):
    """Regions as namespaces (``geotrain.emulate.Emulation``); bytes from htb classes and ``lo``."""

    kernel_shaped = True
    bytes_method = "kernel: htb class per region pair (cross), lo per region (intra)"

    def __init__(self, scenario: dict[str, Any], *, scale: float = 1.0) -> None:
        from geotrain.emulate import Emulation, EmulationConfig, topology_from_dict

        clean_stale_tags()
        self.tag = f"e2e{os.getpid()}"
        topo = topology_from_dict(scenario)
        self.regions = topo.regions
        self.em = Emulation(EmulationConfig(topology=topo, tag=self.tag, scale=scale)).setup()

    def host(self, region: str) -> str:
        return self.em.address(region)

    def exec_prefix(self, region: str) -> list[str]:
        return self.em.exec_prefix(region)

    def env(self, region: str) -> dict[str, str]:
        return {"GLOO_SOCKET_IFNAME": "eth0"}  # gloo binds the region's address, not the namespace's lo

    def counters(self) -> dict[str, dict[str, int]]:
        from geotrain.emulate import status

        st = status(self.tag)
        cross = {f"{src}->{dst}": int(c["sent_bytes"])
                 for src, info in st["regions"].items() for dst, c in info["egress"].items()}
        intra = {}
        for region, info in st["regions"].items():
            out = subprocess.run(["ip", "-n", info["netns"], "-j", "-s", "link", "show", "lo"], capture_output=True,
                                 text=True, timeout=COUNTER_TIMEOUT_S, check=True).stdout
            intra[region] = int(json.loads(out)[0]["stats64"]["tx"]["bytes"])
        return {"cross": cross, "intra": intra}

    def close(self) -> None:
        self.em.teardown()


def clean_stale_tags() -> None:
    """Delete namespaces of earlier ``e2e<pid>`` emulations whose benchmark process is gone."""
    from geotrain.emulate import cleanup
    from geotrain.emulate.netns import list_namespaces

    tags = {ns.split("-")[1] for ns in list_namespaces("gt-e2e")}
    for tag in tags:
        pid = tag[3:]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            logger.warning("removing namespaces of a crashed benchmark run (tag %s)", tag)
            cleanup(tag)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def diff(after: dict[str, dict[str, int]] | None, before: dict[str, dict[str, int]] | None) -> dict[str, Any] | None:
    """Counters moved between two readings: ``{"cross": {...}, "intra": {...}, "cross_total", "total"}``."""
    if after is None or before is None:
        return None
    cross = {k: v - before["cross"].get(k, 0) for k, v in after["cross"].items()}
    intra = {k: v - before["intra"].get(k, 0) for k, v in after["intra"].items()}
    return {"cross": cross, "intra": intra, "cross_total": sum(cross.values()),
            "total": sum(cross.values()) + sum(intra.values())}
