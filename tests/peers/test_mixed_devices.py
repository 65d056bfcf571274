"""Peers with different device settings train one job; every stage group's global state stays bitwise equal.

Four ``geotrain peer`` processes: ``--device cpu`` and ``--device auto`` (the CPU here, CUDA where torch
sees a GPU), each with ``--threads 1`` or ``--threads 2``. The benchmark's device string names the thread
count (``cpu: ... (2 threads)``), so the peers publish different devices, and their kernels need not agree
bit for bit. The data plane carries host-memory tensors whatever the device; a round's all-reduced
pseudo-gradient is one result every member applies to its CPU copy of the global parameters, so the
members of each block segment hold the same global parameters and outer momentum, bit for bit, in the
checkpoint each writes into its own ``--state-dir`` after the last round.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from geotrain.cli.run import run_coordinator
from geotrain.config import job_from_dict
from geotrain.local.procs import ChildGroup
from geotrain.peers.statestore import StateStore

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]

JOB_ID = "mixed-devices"
STEPS, EVERY = 10, 5
SETTINGS = [("cpu", 1), ("cpu", 2), ("auto", 1), ("auto", 2)]  # (--device, --threads) of each peer


def _segments(pipelines: list[list[dict[str, Any]]]) -> list[tuple[int, int, list[str]]]:
    """Block segments with the same holders, as the runtime forms stage groups (``JobPlan.sync_groups``)."""
    cuts = sorted({b for pipe in pipelines for st in pipe for b in st["layers"]})
    return [(a, b, [st["peer"] for pipe in pipelines for st in pipe if st["layers"][0] <= a and b <= st["layers"][1]])
            for a, b in zip(cuts, cuts[1:], strict=False)]


def test_peers_of_different_devices_and_threads_train_one_job(children: ChildGroup, tmp_path: Path) -> None:
    boot = children.start("dht", ["dht", "--host", "127.0.0.1"])
    maddrs = boot.wait_event("ready", timeout=120)["maddrs"]
    state = {}
    ready = []
    for i, (device, threads) in enumerate(SETTINGS):
        d = tmp_path / f"state-{i}"
        child = children.start(f"peer{i}", [
            "peer", "--initial-peers", *maddrs, "--region", "us", "--device", device, "--threads", str(threads),
            "--heartbeat", "2", "--probe-every", "600", "--job", JOB_ID, "--state-dir", str(d)])
        ready.append((child, d, threads))
    for child, d, threads in ready:
        event = child.wait_event("ready", timeout=120)
        state[event["peer_id"]] = (d, event["device"], threads)
    job = job_from_dict({
        "job": {"name": JOB_ID, "seed": 3},
        "model": {"preset": "tiny"},
        "data": {"max_bytes": 1 << 20},
        "pipeline": {"stages": 2, "pipelines": 2, "micro_batch_size": 4, "microbatches": 2},
        "sync": {"every": EVERY, "codec": "int8"},
        "stop": {"steps": STEPS},
        "swarm": {"min_peers": 4, "wait_peers_s": 120, "hop_timeout_s": 20, "round_timeout_s": 20},
        "report": {"eval_batches": 2},
    })
    report = run_coordinator(None, initial_peers=maddrs, job_id=JOB_ID, report_dir=tmp_path / "report", job=job)
    data = json.loads((tmp_path / "report" / "report.json").read_text())

    # the report lists each peer's device as its benchmark published it: the thread counts differ
    devices = {p["peer_id"]: p["device"] for p in data["peers"]}
    assert {devices[q] for q in state} == {dev for _, dev, _ in state.values()}
    assert len({dev for _, dev, _ in state.values()}) >= 2, devices
    if not torch.cuda.is_available():
        assert all(f"({t} thread" in dev for _, dev, t in state.values()), devices

    plan = data["plans"][-1]["pipelines"]
    assert report["summary"]["plan_versions"] == 1 and {st["peer"] for pipe in plan for st in pipe} == set(state)
    val = [v for v in data["validation"] if v["loss"] is not None]
    assert val[-1]["source"] == "global" and val[-1]["loss"] < val[0]["loss"], val  # the job trained
    for start, end, members in _segments(plan):
        # each member's own checkpoint of the last round, from its own state directory
        held = [StateStore(state[m][0]).load(JOB_ID, STEPS, start, end) for m in members]
        assert all(h is not None for h in held), (start, end, members)
        pieces = [h.select(start, end) for h in held if h is not None]
        assert all(p.round == STEPS // EVERY for p in pieces), [p.round for p in pieces]
        first = pieces[0]
        assert first.params and first.momentum, (start, end)
        for other in pieces[1:]:
            assert set(other.params) == set(first.params) and set(other.momentum) == set(first.momentum)
            for name, t in first.params.items():
                assert torch.equal(t, other.params[name]), (start, end, name)
            for name, t in first.momentum.items():
                assert torch.equal(t, other.momentum[name]), (start, end, name)
    # two peers of each thread count on a 2 x 2 grid: a stage group mixes them, or else every pipeline does
    threads = [[state[st["peer"]][2] for st in pipe] for pipe in plan]
    assert all(len(set(col)) == 2 for col in zip(*threads, strict=True)) or all(len(set(row)) == 2 for row in threads)
