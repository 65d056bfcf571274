"""Run one worker contender (DP, hivemind.Optimizer, flat DiLoCo): start its peers, start them together, collect.

Sequence: rank 0 first (it owns the rendezvous: a TCPStore port or the DHT's
multiaddrs, read from its ready line), then the other ranks; when every rank
has printed ``joined`` the kernel counters are read and every rank gets ``go``
on stdin. The counters are read again at the first ``budget`` line (the
fixed-budget bytes). Past the budget, each snapshot of a new token count goes to
``reached`` (the benchmark evaluates it); when it says the target loss is
reached, every rank gets ``stop`` on stdin. Each rank's ``done`` line carries its own training wall time and
forward/backward time; ``snapshot`` lines are the global model's checkpoints.
DP and flat DiLoCo snapshot on rank 0 only; every hivemind.Optimizer peer
snapshots the epochs it reaches, since a peer that lags loads the swarm's
state and skips epochs (rank 0 alone once skipped the whole budget). Per
token count the earliest snapshot is kept (when that global model first existed). Every child is ended when the
run is over, whatever happened.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
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
    kernel_bytes: dict[str, Any] | None = None  # go -> end (the whole run, past the budget too)
    kernel_setup_bytes: dict[str, Any] | None = None
    kernel_budget_bytes: dict[str, Any] | None = None  # go -> the first budget line (from any rank)
    budget_s: float | None = None  # wall time at the first budget line
    stopped: str | None = None  # "target" (the benchmark sent stop), else what the workers said (cap, timeout)


class Snapshots:
    """The global model's snapshots, one per token count: the earliest (when that model first existed)."""

    def __init__(self) -> None:
        self._by_tokens: dict[int, dict[str, Any]] = {}

    def add(self, event: dict[str, Any], rank: int) -> bool:
        """Keep ``event`` if it is the first or earliest of its token count; True for a new token count."""
        tokens = int(event["tokens"])
        have = self._by_tokens.get(tokens)
        if have is None or float(event["t_s"]) < float(have["t_s"]):
            self._by_tokens[tokens] = {**event, "rank": rank}
        return have is None

    def last(self) -> dict[str, Any] | None:
        """The snapshot of the most tokens, or None."""
        return self._by_tokens[max(self._by_tokens)] if self._by_tokens else None

    def ordered(self) -> list[dict[str, Any]]:
        return [self._by_tokens[t] for t in sorted(self._by_tokens)]


def run_workers(
    kind: str, spec: WorkerSpec, *, network: Network, regions: list[str], work_dir: Path, timeout_s: float,
    reached: Callable[[dict[str, Any]], bool] | None = None,
) -> WorkerRun:
    """Run ``spec.world`` peers of contender ``kind`` (a key of :data:`MODULES`) and wait for them all.

    ``reached(snapshot event)``: called on each of rank 0's snapshots after its
    budget event; True sends ``stop`` to every rank.
    """
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
        dones: dict[int, dict[str, Any]] = {}
        at_budget: dict[str, dict[str, int]] | None = None
        budget_seen, stop_sent = False, False
        budget_s: float | None = None
        snapshots = Snapshots()
        while len(dones) < len(ranks):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{kind}: {len(ranks) - len(dones)} ranks not done within {timeout_s:.0f}s")
            for rank, p in enumerate(ranks):
                if rank in dones:
                    continue
                e = p.next_event(0.05 if rank else 0.2)
                if e is None:
                    continue
                kind_e = e.get("event")
                if kind_e == "done":
                    dones[rank] = e
                    if rank == 0:
                        # rank 0's snapshots are the global model and it has stopped (cap, target or timeout): a
                        # straggler training on alone adds nothing to the curve, only to the run's wall time (a
                        # hivemind.Optimizer peer that missed the last epoch's group went on for ~80 s solo)
                        for q, other in enumerate(ranks):
                            if q not in dones:
                                _send(other, "stop")
                elif kind_e == "budget" and not budget_seen:
                    budget_seen, at_budget, budget_s = True, network.counters(), float(e["t_s"])
                    last = snapshots.last()
                    if last is not None and reached is not None and reached(last):  # reached within the budget
                        stop_sent = True
                        for q, other in enumerate(ranks):
                            if q not in dones:
                                _send(other, "stop")
                elif kind_e == "snapshot":
                    fresh = snapshots.add(e, rank)
                    if fresh and budget_seen and not stop_sent and reached is not None and reached(e):
                        stop_sent = True
                        for q, other in enumerate(ranks):
                            if q not in dones:
                                _send(other, "stop")
        at_end = network.counters()
    ordered = [dones[r] for r in range(len(ranks))]
    wall = max(float(d["train_s"]) for d in ordered)
    return WorkerRun(wall_s=wall, dones=ordered, snapshots=snapshots.ordered(),
                     kernel_bytes=diff(at_end, at_go), kernel_setup_bytes=diff(at_go, before_setup),
                     kernel_budget_bytes=diff(at_budget, at_go) if at_budget is not None else None,
                     budget_s=budget_s,
                     stopped="target" if stop_sent else str(ordered[0].get("stopped", "budget")))


def _send(child: Any, line: str) -> None:
    """Write a line to a worker that may have just exited (its stdin then is closed: nothing to tell it)."""
    try:
        child.send(line)
    except (BrokenPipeError, ValueError, OSError):
        logger.debug("%s exited before %r", child.name, line)
