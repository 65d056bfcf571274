"""Smoke test of benchmarks/codecs.py at a tiny size: it runs and prints well-formed JSON lines."""

from __future__ import annotations

import json

import pytest

from benchmarks.codecs import GEOTRAIN, HIVEMIND, main


def test_codecs_benchmark_tiny(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--numel", "5000", "--repeat", "1"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    summary = lines[-1]
    assert summary["event"] == "summary" and summary["numel"] == 5000
    rows = [r for r in lines[:-1] if "skipped" not in r]
    skipped = {r["codec"] for r in lines[:-1] if "skipped" in r}
    for kind in ("normal", "heavy"):
        names = {r["codec"] for r in rows if r["tensor"] == kind}
        assert names | skipped == set(GEOTRAIN) | set(HIVEMIND)
    for r in rows:
        assert r["impl"] in ("geotrain", "hivemind")
        for key in ("encode_MBps", "decode_MBps", "roundtrip_MBps", "ratio", "rel_err"):
            assert isinstance(r[key], float | int) and r[key] >= 0, (r["codec"], key)
    by = {(r["codec"], r["tensor"]): r for r in rows}
    assert by[("int8", "normal")]["rel_err"] < 0.01
    assert by[("int4", "normal")]["ratio"] >= 7.5
    assert by[("topk+ef", "normal")]["ratio"] >= 30
    assert summary["targets_met"]["int4_ratio_7.5"] and summary["targets_met"]["topk_ef_ratio_30"]
