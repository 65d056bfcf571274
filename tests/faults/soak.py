"""The churn soak (item 13): a job on four peers while peers are SIGKILLed and replaced.

Used by ``tests/faults/test_soak.py`` (a short form in CI, a long one marked
slow). Returns the figures the issue asks for:

- **goodput** = tokens whose training survives into the final model / tokens attempted.
  A plan ``v`` that starts at ``start_v`` and is followed by a plan starting at
  ``start_{v+1}`` keeps ``P_v x (start_{v+1} - start_v)`` pipeline-steps (the
  coordinator restarts every pipeline at a committed round boundary); the last
  plan keeps everything up to the stop step. Attempted are the steps each
  pipeline actually ran in each plan, read from the peers' progress records
  (polled every ``poll_s``: the last fraction of a second before a plan change
  may be missed, which flatters goodput by at most that much).
- **RSS and open fds** of the processes that live through the whole soak (the
  bootstrap, the coordinator, the peers never killed), after warm-up and at the end.
- **churn** = replaced peers per live peer per minute.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

from geotrain.local.procs import Child, ChildGroup
from geotrain.local.swarm import start_local_swarm
from geotrain.swarm import Swarm, SwarmConfig
from geotrain.swarm.records import PeerStatus

TOKENS_PER_STEP = 4 * 2 * 32  # micro_batch_size x microbatches x seq_len (tiny), per pipeline

JOB = """
[job]
name = "soak"
seed = 5
[model]
preset = "tiny"
[data]
max_bytes = 1048576
[pipeline]
stages = 2
pipelines = "auto"
micro_batch_size = 4
microbatches = 2
[sync]
every = 5
[stop]
steps = 1000000
wall_s = {wall_s}
[swarm]
min_peers = 4
wait_peers_s = 120
hop_timeout_s = 4
round_timeout_s = 4
# the job's liveness period: a killed peer must be seen gone well inside the short soak's 40 s (the coordinator
# reads progress once per this period; with the default 10 s the death came after the job's end in one run)
heartbeat_s = 2
[checkpoint]
# a killed peer may be its blocks' only holder (the planner may run one pipeline and keep spares); this soak
# measures churn's goodput and resource growth, not state durability (tests/faults/test_resume_from_swarm.py)
allow_seed_restart = true
[report]
eval_batches = 2
"""


def _usage(pid: int) -> tuple[float, int]:
    """(RSS MiB, open fds) of one process."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    return rss, len(list(Path(f"/proc/{pid}/fd").iterdir()))


class _ProgressWatch:
    """Polls every peer's progress record; keeps the highest step seen per (peer, plan version)."""

    def __init__(self, maddrs: list[str], poll_s: float) -> None:
        self.reached: dict[tuple[str, int], int] = {}
        self.training: set[str] = set()  # peers whose latest record says they train a stage
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(maddrs, poll_s), daemon=True)
        self._thread.start()

    def _run(self, maddrs: list[str], poll_s: float) -> None:
        cfg = SwarmConfig(initial_peers=tuple(maddrs), client_mode=True, timeout_s=10.0)
        with Swarm(cfg) as swarm:
            while not self._stop.is_set():
                try:
                    progress = swarm.get_progress()
                    for pid, rec in progress.items():
                        key = (pid, rec.plan_version)
                        self.reached[key] = max(self.reached.get(key, 0), rec.step)
                    self.training = {pid for pid, rec in progress.items() if rec.status == PeerStatus.TRAINING}
                except Exception:  # a slow DHT read is retried at the next poll
                    pass
                self._stop.wait(poll_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)


def goodput(report: dict[str, Any], reached: dict[tuple[str, int], int]) -> dict[str, Any]:
    plans = sorted(report["plans"], key=lambda p: p["version"])
    stops = [e["stop_step"] for e in report["events"] if e.get("kind") == "stop"]
    final_step = stops[-1] if stops else max(reached.values())
    kept = attempted = 0
    for i, plan in enumerate(plans):
        start = plan["start_step"]
        end = plans[i + 1]["start_step"] if i + 1 < len(plans) else final_step
        pipes = plan["pipelines"]
        kept += len(pipes) * max(0, end - start)
        for pipe in pipes:
            if i + 1 == len(plans):
                ran = final_step
            else:
                ran = max((reached.get((s["peer"], plan["version"]), start) for s in pipe), default=start)
            attempted += max(0, ran - start)
    return {
        "tokens_kept": kept * TOKENS_PER_STEP,
        "tokens_attempted": attempted * TOKENS_PER_STEP,
        "goodput": kept / attempted if attempted else 0.0,
        "plans": len(plans),
    }


def run_soak(children: ChildGroup, tmp_path: Path, *, kills: int, period_s: float, wall_s: float,
             seed: int = 0, poll_s: float = 0.3, warmup_s: float = 5.0) -> dict[str, Any]:
    rng = random.Random(seed)
    job = tmp_path / "soak.toml"
    job.write_text(JOB.format(wall_s=wall_s))
    regions = ["us", "us", "eu", "eu"]  # as in the e2e tests: the planner makes two 2-stage pipelines
    swarm = start_local_swarm(children, regions=regions, job_id="soak", heartbeat_s=1.0)
    coord = children.start("coordinator", ["run", str(job), "--initial-peers", *swarm.maddrs, "--json",
                                           "--job-id", "soak", "--report-dir", str(tmp_path / "report")])
    coord.wait_event("plan", 120)
    watch = _ProgressWatch(swarm.maddrs, poll_s)
    live: dict[str, Child] = dict(zip(swarm.peer_ids(), swarm.peers, strict=True))
    region_of = dict(zip(swarm.peer_ids(), regions, strict=True))
    originals = set(live)
    deadline = time.monotonic() + 90
    while len(watch.training) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)  # until the progress watch knows who trains (polling, not an assertion)
    time.sleep(warmup_s)  # torch and the allocator settle before the baseline sample (not an assertion)
    steady = {"bootstrap": swarm.bootstrap, "coordinator": coord}
    t_churn = time.monotonic()
    killed: list[str] = []
    for k in range(kills):
        # a peer that trains a stage right now (killing a spare costs nothing)
        candidates = sorted((set(live) & watch.training) - set(killed)) or sorted(set(live) - set(killed))
        victim = rng.choice(candidates)
        if k == 0:  # the processes that will live through the whole soak, sampled now
            for pid, child in live.items():
                if pid != victim:
                    steady[pid] = child
            before = {name: _usage(c.pid) for name, c in steady.items()}
        children.kill(live.pop(victim), signal.SIGKILL)
        killed.append(victim)
        fresh = children.start(f"joiner{k}", ["peer", "--initial-peers", *swarm.maddrs, "--region", region_of[victim],
                                              "--threads", "1", "--heartbeat", "1", "--probe-every", "600",
                                              "--job", "soak"])
        new_id = fresh.wait_event("ready", 120)["peer_id"]
        live[new_id] = fresh
        region_of[new_id] = region_of[victim]
        for name in list(steady):
            if name in killed:
                del steady[name]
        if k == kills // 2:
            middle = {name: _usage(c.pid) for name, c in steady.items()}
        time.sleep(max(0.0, period_s - (time.monotonic() - t_churn) % period_s))  # churn schedule, not a wait-to-assert
    churn_s = time.monotonic() - t_churn
    report_event = coord.wait_event("report", wall_s + 240)
    after = {name: _usage(c.pid) for name, c in steady.items() if c.proc.poll() is None}
    watch.close()
    report = json.loads(Path(report_event["path"]).read_text())
    figures = goodput(report, watch.reached)
    figures.update({
        "kills": kills,
        "churn_per_peer_per_min": kills / 4 / (churn_s / 60),
        "churn_s": round(churn_s, 1),
        "wall_s": report["summary"]["wall_s"],
        "deaths": report["summary"]["deaths"],
        "val_loss_initial": report["summary"]["val_loss_initial"],
        "val_loss_final": report["summary"]["val_loss_final"],
        "usage_before": {k: before[k] for k in after if k in before},
        "usage_middle": {k: middle[k] for k in after if k in middle},
        "usage_after": after,
        "survivors_of_originals": len(originals - set(killed)),
    })
    return figures
