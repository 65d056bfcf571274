"""Shared pieces for the live-peer tests: a tiny job, a coordinator thread, progress reads."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Any

from geotrain.config import job_from_dict
from geotrain.swarm import ProgressRecord, Swarm, SwarmConfig


def tiny_job(*, steps: int, min_peers: int, stages: int = 2, pipelines: int | str = 1,
             sync_every: int = 5, sync_codec: str = "int8", **swarm: Any) -> Any:
    spec = {
        "job": {"name": "adv", "seed": 3},
        "model": {"preset": "tiny"},
        "data": {"max_bytes": 1 << 20},
        "pipeline": {"stages": stages, "pipelines": pipelines, "micro_batch_size": 4, "microbatches": 2},
        "sync": {"every": sync_every, "codec": sync_codec},
        "stop": {"steps": steps},
        "swarm": {"min_peers": min_peers, "wait_peers_s": 90, "hop_timeout_s": 6, "round_timeout_s": 6, **swarm},
        "report": {"eval_batches": 2},
    }
    return job_from_dict(spec)


class CoordinatorThread:
    """``run_coordinator`` in a thread; its events are queued for the test to wait on."""

    def __init__(self, maddrs: list[str], job: Any, job_id: str, report_dir: Path) -> None:
        from geotrain.cli.run import run_coordinator

        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.report: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.stop = threading.Event()

        def body() -> None:
            try:
                self.report = run_coordinator(None, initial_peers=maddrs, job_id=job_id, report_dir=report_dir,
                                              emit=self.events.put, job=job, stop=self.stop)
            except BaseException as e:  # handed to the test thread, which re-raises it
                self.error = e

        self.thread = threading.Thread(target=body, daemon=True, name="coordinator")
        self.thread.start()

    def wait_for(self, predicate: Any, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no matching coordinator event within {timeout}s; last: {self.seen[-3:]}")
            try:
                e = self.events.get(timeout=min(left, 0.5))
            except queue.Empty:
                if not self.thread.is_alive():
                    raise RuntimeError(f"coordinator ended early: {self.error!r}") from self.error
                continue
            self.seen.append(e)
            if predicate(e):
                return e

    def latest_step(self) -> int:
        """The highest step in the newest progress event so far (queued events are taken, not waited for)."""
        while not self.events.empty():
            self.seen.append(self.events.get_nowait())
        steps = [max((p["step"] for p in e["peers"].values()), default=0)
                 for e in self.seen if e.get("event") == "progress"]
        return steps[-1] if steps else 0

    def join(self, timeout: float) -> dict[str, Any]:
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.stop.set()
            raise TimeoutError(f"job did not finish within {timeout}s")
        if self.error is not None:
            raise self.error
        assert self.report is not None
        while not self.events.empty():
            self.seen.append(self.events.get_nowait())
        return self.report


def read_progress(maddrs: list[str], peer_id: str, predicate: Any, timeout: float) -> ProgressRecord:
    """Join as a DHT client and wait until ``peer_id``'s progress record satisfies ``predicate``."""
    cfg = SwarmConfig(initial_peers=tuple(maddrs), client_mode=True, timeout_s=10.0)
    deadline = time.monotonic() + timeout
    last = None
    with Swarm(cfg) as swarm:
        while time.monotonic() < deadline:
            last = swarm.get_progress().get(peer_id)
            if last is not None and predicate(last):
                return last
            time.sleep(0.5)  # a DHT poll period, not an assertion delay
    raise TimeoutError(f"progress of {peer_id} never matched; last: {last}")
