"""Smoke test of benchmarks.checkpoint: real workers checkpoint, resume from their directories, bitwise."""

from __future__ import annotations

import json

import pytest

from benchmarks.checkpoint import main


@pytest.mark.timeout(180)
def test_checkpoint_benchmark_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--tiny"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    (row,) = [r for r in lines if r.get("bench") == "checkpoint"]
    # resumed from the peers' own directories, residuals and AdamW moments included: bit-identical to the run
    # that was never interrupted (without the local state it is not: see the benchmark's docstring)
    assert row["bitwise_resume"] and row["local_state_restored"] and row["resumed_from"] == ["store"]
    assert row["fetched_bitwise"] and row["size_bytes"] > 0 and row["checkpoints"] == 2
    assert lines[-1] == {"event": "summary", "ok": True}
