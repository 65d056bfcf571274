"""Run one worker contender (DP, hivemind.Optimizer, flat DiLoCo): start its peers, start them together, collect.

Sequence: rank 0 first (it owns the rendezvous: a TCPStore port or the DHT's
multiaddrs, read from its ready line), then the other ranks; when every rank
has printed ``joined`` the kernel counters are read and every rank gets ``go``
on stdin. Each rank's ``done`` line carries its own training wall time and
forward/backward time; rank 0's ``snapshot`` lines are the global model's
checkpoints. Every child is ended when the run is over, whatever happened.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.contenders.common import WorkerSpec
from benchmarks.contenders.launch import Network, Procs, diff

logger = logging.getLogger(__name__)

MODULES = {
    "ddp": "benchmarks.contenders.ddp",
    "hivemind": "benchmarks.contenders.hivemind_opt",
    "diloco": "benchmarks.contenders.diloco",
}


@dataclass
class WorkerRun:
    """What one worker contender produced."""

    wall_s: float
    dones: list[dict[str, Any]]
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    kernel_bytes: dict[str, Any] | None = None
    kernel_setup_bytes: dict[str, Any] | None = None


def run_workers(
    kind: str, spec: WorkerSpec, *, network: Network, regions: list[str], work_dir: Path, timeout_s: float
) -> WorkerRun:
    """Run ``spec.world`` peers of contender ``kind`` (a key of :data:`MODULES`) and wait for them all."""
    module = MODULES[kind]
    spec_path = spec.dump(work_dir / "spec.json")
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    with Procs(network, stderr_dir=str(work_dir)) as procs:
        before_setup = network.counters()

        def start(rank: int, extra: list[str]) -> Any:
            region = regions[rank]
            args = ["--spec", str(spec_path), "--rank", str(rank), "--host", network.host(region), *extra]
            if kind == "diloco":
                args += ["--region", region]
            return procs.start_in(f"{kind}{rank}", module, args, region=region)

        r0 = start(0, [])
        ready = r0.wait_event("ready", left())
        extra = ["--master", ready["master"]] if kind == "ddp" else ["--initial-peers", *ready["maddrs"]]
        ranks = [r0] + [start(r, extra) for r in range(1, spec.world)]
        for p in ranks:
            p.wait_event("joined", left())
        at_go = network.counters()
        for p in ranks:
            p.send("go")
        dones = [p.wait_event("done", left()) for p in ranks]
        at_end = network.counters()
        snapshots = [e for e in r0.seen if e.get("event") == "snapshot"]
    wall = max(float(d["train_s"]) for d in dones)
    return WorkerRun(wall_s=wall, dones=dones, snapshots=snapshots,
                     kernel_bytes=diff(at_end, at_go), kernel_setup_bytes=diff(at_go, before_setup))
