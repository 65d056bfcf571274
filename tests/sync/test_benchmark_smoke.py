"""Tiny runs of ``python -m benchmarks.sync``: every backend prints its JSON line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.sync import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--steps", "4", "--every", "2", "--batch", "2", "--val-batches", "1", "--data-bytes", "262144"]


def _lines(capsys: pytest.CaptureFixture[str]) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def test_benchmark_smoke_dp_and_geotrain(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*TINY, "--backends", "dp,geotrain", "--fragments", "2", "--overlap", "1"]) == 0
    lines = _lines(capsys)
    results = {x["backend"]: x for x in lines if x["event"] == "result"}
    assert set(results) == {"dp", "geotrain"}
    assert results["geotrain"]["rounds_committed"] == 4 and results["geotrain"]["replicas_identical"]
    assert 0 < results["geotrain"]["cross_region_bytes"] < results["dp"]["cross_region_bytes"]
    summary = lines[-1]
    assert summary["event"] == "summary" and summary["dp_over_geotrain_cross_bytes"] > 1


@pytest.mark.multiprocess
def test_benchmark_smoke_hivemind() -> None:
    # In a child process with a hard deadline: a stalled hivemind averager leaves threads that no timeout in
    # this process can stop (the benchmark's thread pool then waits on them forever); a child is killed.
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.sync", *TINY, "--backends", "hivemind", "--replicas", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=ROOT,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the hivemind benchmark did not finish in 120 s")
    assert proc.returncode == 0, err[-3000:]
    result = [json.loads(line) for line in out.splitlines() if line.startswith("{")][0]
    assert result["backend"] == "hivemind" and result["rounds_committed"] == 2
    assert result["cross_region_bytes"] > 0
