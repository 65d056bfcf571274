"""Launch a local swarm: one bootstrap DHT node and peers in labelled regions, as child processes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from geotrain.local.procs import Child, ChildGroup


@dataclass
class LocalSwarm:
    """What :func:`start_local_swarm` started: the bootstrap's multiaddrs and each peer's child + ready event."""

    maddrs: list[str]
    bootstrap: Child
    peers: list[Child] = field(default_factory=list)
    ready: list[dict[str, Any]] = field(default_factory=list)

    def peer_ids(self) -> list[str]:
        return [r["peer_id"] for r in self.ready]


def start_local_swarm(
    children: ChildGroup,
    *,
    regions: Sequence[str],
    job_id: str | None = None,
    prices: dict[str, float] | None = None,
    heartbeat_s: float = 2.0,
    emulate: str | None = None,
    emulate_bandwidth: bool = False,
    extra: Sequence[str] = (),
    timeout: float = 120.0,
) -> LocalSwarm:
    """Start ``geotrain dht`` and one ``geotrain peer`` per entry of ``regions``; wait until all are ready."""
    boot = children.start("dht", ["dht", "--host", "127.0.0.1"])
    maddrs = boot.wait_event("ready", timeout=timeout)["maddrs"]
    swarm = LocalSwarm(maddrs=maddrs, bootstrap=boot)
    for i, region in enumerate(regions):
        cmd = ["peer", "--initial-peers", *maddrs, "--region", region, "--threads", "1",
               "--heartbeat", str(heartbeat_s), "--probe-every", "600",
               "--price", str((prices or {}).get(region, 1.0))]
        if job_id is not None:
            cmd += ["--job", job_id]
        if emulate is not None:
            cmd += ["--emulate", emulate]
            if emulate_bandwidth:
                cmd.append("--emulate-bandwidth")
        cmd += list(extra)
        swarm.peers.append(children.start(f"peer{i}-{region}", cmd))
    for child in swarm.peers:
        swarm.ready.append(child.wait_event("ready", timeout=timeout))
    return swarm
