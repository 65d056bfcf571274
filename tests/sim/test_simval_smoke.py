"""Smoke test of ``python -m benchmarks.simval --smoke``: one real geotrain job on emulated regions, then the
simulator on the same scenario and plan; ``--from`` re-analyses the kept run to the same lines.

Regions are network namespaces when root (kernel byte counters); without root the benchmark runs on
loopback with geotrain's transport emulating the links, and the kernel-only checks are skipped.
"""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import simval

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]


def _lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_simval_smoke(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    code = simval.main(["--smoke", "--work-dir", str(tmp_path)])
    lines = _lines(capsys.readouterr().out)
    assert code == 0, lines
    cal = next(x for x in lines if x["event"] == "calibration")
    rec = next(x for x in lines if x["event"] == "config")
    m = rec["measured"]
    assert m["tokens"] > 0 and m["tokens_per_s"] > 0
    # the simulator models the data plane: int8 pseudo-gradients of every round across regions
    assert 0.8 <= rec["data_plane_cross_bytes_ratio"] <= 1.25, rec
    # compute as the run measured it is a lower bound on the step: the simulator is never slower than the run
    assert rec["in_run_tokens_ratio"] >= 0.85, rec
    # the host model: every term >= 0, the peers' CPU explained, some of the box left to the peers
    assert all(v >= 0 for v in cal["host"].values()) and rec["calibrated_on_self"], cal
    assert cal["cpu_fit_rel_rms"] < 0.25 and 0 <= cal["reserved_cores"] < cal["cores"], cal
    ps = rec["where_time_went"]
    assert ps["cpu_per_step_s"] > 0 and ps["compute_per_step_s"] > 0 and ps["round_s"] > 0, ps
    # a tiny run (start-up is much of its wall time) on a box that may be busy: no accuracy claim here, only
    # that the host floor and the measured round overhead can only lengthen the planner-fed simulation's step
    assert 0 < rec["calibrated_tokens_ratio"] <= rec["planner_tokens_ratio"] * (1 + 1e-6), rec
    if os.geteuid() == 0:
        assert m["kernel_cross_bytes"] >= m["data_plane_cross_bytes"] > 0  # the kernel counts the DHT too
        assert cal["control_bytes_per_peer_s"] > 0
    # the kept run re-analyses to the same figures without training
    assert simval.main(["--smoke", "--from", str(tmp_path)]) == 0
    again = _lines(capsys.readouterr().out)
    assert [x for x in again if x["event"] == "config"] == [rec]
