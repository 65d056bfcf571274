"""Smoke test of ``python -m benchmarks.streams --smoke``: one and two TCP streams, and geotrain's data plane, over
an emulated, delayed link."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import streams
from tests.emulate.support import netns_unavailable

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]


def test_streams_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    why = netns_unavailable() or (None if os.path.exists("/dev/net/tun") else "needs /dev/net/tun")
    if why is not None:
        pytest.skip(why)
    assert streams.main(["--smoke"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    config, summary = lines[0], lines[-1]
    assert config["event"] == "config" and config["streams"] == [1, 2] and config["bdp_bytes"] == 100_000
    trials = [ln for ln in lines if ln["event"] == "trial"]
    assert sorted(t["streams"] for t in trials) == [1, 2]
    # 1 MB at 20 Mbit/s is 0.4 s on an ideal link: nothing moves faster than the shaped rate
    assert all(t["seconds"] >= 0.9 * config["ideal_s"] for t in trials), trials
    per_k = {ln["streams"]: ln for ln in lines if ln["event"] == "streams"}
    assert per_k[1]["speedup_vs_1"] == 1.0 and per_k[2]["speedup_vs_1"] > 0
    assert summary["event"] == "summary" and summary["best_streams"] in (1, 2)
    # geotrain's own data plane over the same link: one message over one connection, and split over two
    planes = {ln["streams"]: ln for ln in lines if ln["event"] == "data_plane"}
    assert sorted(planes) == [1, 2] and planes[1]["vs_data_plane_1"] == 1.0
    for plane in planes.values():
        assert plane["median_s"] >= 0.9 * config["ideal_s"] and 0 < plane["link_share"] <= 1.1
