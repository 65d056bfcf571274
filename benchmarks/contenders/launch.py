"""Processes of a contender, started inside emulated regions, and the kernel's byte counters.

A *network* is where the contenders' peers live:

- :class:`NetnsNetwork`: one Linux network namespace per region (``geotrain.emulate.Emulation``,
  htb bandwidth per region pair; root) and, where ``/dev/net/tun`` exists, the delay layer
  (``geotrain.emulate.delay``: every packet between regions held for the link's one-way
  delay in the router namespace, below every contender alike). Bytes are read from the kernel: the htb
  class of each (source region -> destination region) pair counts cross-region
  bytes, the ``lo`` device inside each region counts intra-region bytes. Every
  contender is counted the same way, headers, control plane and all.
- :class:`LoopbackNetwork`: everything on 127.0.0.1, nothing shaped by the kernel
  (no root). Contenders count their own bytes where they can.

:class:`Procs` starts ``python -m MODULE ...`` children in a region (their own
process group, stdin kept open for the start barrier) with the tests'
:class:`~geotrain.local.procs.ChildGroup`: JSON lines collected, events
waited on with timeouts, every child ended on close.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Sequence
from typing import Any

from geotrain.local.procs import Child, ChildGroup

logger = logging.getLogger(__name__)

COUNTER_TIMEOUT_S = 10.0


Proc = Child  # one child and the JSON events it printed (geotrain.local.procs)


class Procs(ChildGroup):
    """Starts children (in a region when the network has namespaces) and reaps them all on close."""

    def __init__(self, network: Network, *, stderr_dir: str | None = None) -> None:
        # forked from a server that imported torch and hivemind once: every contender's clock starts after
        # its setup (a start barrier), so this saves the suite's CPU and changes no measured figure
        super().__init__(preload=True)
        self.network = network
        self._stderr_dir = stderr_dir

    def start_in(self, name: str, module: str, args: Sequence[str], *, region: str,
                 env: dict[str, str] | None = None) -> Child:
        """``python -m module *args`` in ``region``, stdin open for the start barrier."""
        return super().start(
            name, args, module=module, prefix=self.network.exec_prefix(region),
            env={**self.network.env(region), **(env or {})}, stdin=True,
            stderr_path=None if self._stderr_dir is None else os.path.join(self._stderr_dir, f"{name}.stderr"),
        )


class Network:
    """Where peers run. ``kernel_shaped``: the kernel shapes bandwidth between regions."""

    kernel_shaped = False
    kernel_delayed = False  # every packet between regions pays the link's one-way delay below the contenders
    delay_method = "none"
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

    def check(self) -> None:
        """Raise when the network's own machinery failed (nothing to check here)."""

    def close(self) -> None:
        pass


class LoopbackNetwork(Network):
    """No root: every peer on loopback; the kernel neither shapes nor counts per region."""


class NetnsNetwork(Network):
    """Regions as namespaces (``geotrain.emulate.Emulation``); bytes from htb classes and ``lo``."""

    kernel_shaped = True
    bytes_method = "kernel: htb class per region pair (cross), lo per region (intra)"

    def __init__(self, scenario: dict[str, Any], *, scale: float = 1.0, delay: bool = True) -> None:
        from geotrain.emulate import Emulation, EmulationConfig, topology_from_dict
        from geotrain.emulate.delay import DelayConfig, DelayLayer

        clean_stale_tags()
        self.tag = f"e2e{os.getpid()}"
        topo = topology_from_dict(scenario)
        self.regions = topo.regions
        config = EmulationConfig(topology=topo, tag=self.tag, scale=scale)
        self.em = Emulation(config).setup()
        self.delay: DelayLayer | None = None
        if delay:
            try:
                self.delay = DelayLayer(DelayConfig.from_emulation(config)).start()
            except Exception:
                self.em.teardown()
                raise
            self.kernel_delayed = True
            self.delay_method = self.delay.method

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

    def check(self) -> None:
        """Raise if the delay layer died (the regions would be cut off: a contender's failure is not its own)."""
        from geotrain.errors import EmulationError

        if self.delay is not None and not self.delay.alive():
            raise EmulationError("the delay process in the router namespace is gone")

    def close(self) -> None:
        if self.delay is not None:
            self.delay.close()
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
