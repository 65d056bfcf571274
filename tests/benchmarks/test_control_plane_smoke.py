"""Smoke test of ``python -m benchmarks.control_plane`` at N = 4 and 8 (tiny windows; figures not asserted)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from geotrain.peers.probe import ProbeConfig
from geotrain.swarm.probe_targets import LOCAL_TARGETS, PER_REGION_TARGETS

pytestmark = [pytest.mark.multiprocess, pytest.mark.netns, pytest.mark.timeout(600)]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2 (a namespace)")
def test_control_plane_benchmark_prints_a_line_per_phase_and_a_summary() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.control_plane", "--peers", "4,8", "--regions", "2",
         "--window", "5", "--settle", "3", "--quiet-window", "2", "--joiner-tail", "1"],
        capture_output=True, text=True, timeout=560,
    )
    assert out.returncode == 0, f"exit {out.returncode}\nstdout:\n{out.stdout[-3000:]}\nstderr:\n{out.stderr[-6000:]}"
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    idle = [r for r in lines if r.get("phase") == "idle"]
    joiner = [r for r in lines if r.get("phase") == "joiner"]
    summary = lines[-1]
    assert [r["peers"] for r in idle] == [4, 8] and [r["peers"] for r in joiner] == [4, 8]
    # the DHT's own share is counted where nftables exists; the namespace's total always is
    assert all(r.get("dht_bytes_per_peer_s", r["total_bytes_per_peer_s"]) > 0 and r["window_s"] >= 5 for r in idle)
    assert summary["summary"] and summary["peers"] == [4, 8] and len(summary["idle_bytes_per_peer_s"]) == 2
    # every node holds at least its connection to the bootstrap (where ss can list them)
    assert all(r["dht_connections_per_node"] is None or r["dht_connections_per_node"] >= 1 for r in idle), idle
    # a joiner measures its targets among the older peers and nobody probes it back, so the probe bytes
    # it causes are bounded by its own targets' probes (pings and at most 2 x max_bytes plus the ramp each)
    per_link = 3 * ProbeConfig().max_bytes
    for r in joiner:
        assert 1 <= r["links_measured"] <= LOCAL_TARGETS + PER_REGION_TARGETS
        if r["data_bytes"] is not None:
            assert r["data_bytes"] <= (LOCAL_TARGETS + PER_REGION_TARGETS) * per_link * 1.1
