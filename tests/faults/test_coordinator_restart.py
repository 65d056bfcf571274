"""Item 10: the coordinator is SIGKILLed mid-run. Training goes on; a restarted coordinator (same
identity, same job id) reattaches to its plan instead of planning again, and the job ends with one plan.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from geotrain.local.procs import ChildGroup
from geotrain.local.swarm import start_local_swarm
from geotrain.swarm import Swarm, SwarmConfig
from tests.adversarial.live import read_progress

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(400)]  # 61 s idle, 75 s beside two busy loops

JOB = """
[job]
name = "restart"
seed = 1
[model]
preset = "tiny"
[data]
max_bytes = 1048576
[pipeline]
stages = 2
pipelines = 1
micro_batch_size = 4
microbatches = 2
[sync]
every = 5
[stop]
steps = 1500
[swarm]
min_peers = 2
wait_peers_s = 90
hop_timeout_s = 6
round_timeout_s = 6
# the job's liveness period, which is also how often the coordinator reads progress: its first progress event
# must come while the peers still train (400 steps took 9 s here, done before a 10 s read)
heartbeat_s = 1
[report]
eval_batches = 2
"""


def test_killed_coordinator_training_goes_on_and_a_restart_reattaches(children: ChildGroup, tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    swarm = start_local_swarm(children, regions=["us", "us"], job_id="restart", heartbeat_s=1.0)
    args = ["run", str(job), "--initial-peers", *swarm.maddrs, "--json", "--job-id", "restart",
            "--identity", str(tmp_path / "coord.key"), "--report-dir", str(tmp_path / "report")]
    first = children.start("coordinator-1", args)
    plan = first.wait_event("plan", 120)
    assert plan["version"] == 1
    seen = first.wait_event("progress", 60)
    while not seen["peers"] or min(p["step"] for p in seen["peers"].values()) < 5:
        seen = first.wait_event("progress", 60)
    at_kill = max(p["step"] for p in seen["peers"].values())
    children.kill(first, signal.SIGKILL)  # the coordinator, its DHT process and its p2pd
    # nobody coordinates now: the peers keep training on the plan they hold
    last = swarm.peer_ids()[0]
    moved = read_progress(swarm.maddrs, last, lambda p: p.step >= at_kill + 20, 90)
    assert moved.plan_version == 1
    second = children.start("coordinator-2", args)
    assert second.wait_event("reattach", 120)["version"] == 1
    report = second.wait_event("report", 180)
    assert report["summary"]["job_id"] == "restart"
    # the restarted coordinator never planned again: no second plan of version 1, no version 2
    assert not any(line.startswith('{"event": "plan"') for line in second.lines), second.lines[:5]
    assert second.proc.wait(timeout=30) == 0
    cfg = SwarmConfig(initial_peers=tuple(swarm.maddrs), client_mode=True, timeout_s=10.0)
    with Swarm(cfg) as reader:
        newest = reader.latest_plan(job_id="restart")
    assert newest is not None and newest.version == 1
