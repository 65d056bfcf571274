"""A tiny run of ``python -m benchmarks.local_ranks``: both configurations print their line, the weights agree."""

from __future__ import annotations

import json

import pytest

from benchmarks.local_ranks import main

pytestmark = pytest.mark.multiprocess


def test_local_ranks_benchmark_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--steps", "3", "--batch", "4", "--microbatches", "2"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    one, two, summary = lines
    assert (one["ranks"], two["ranks"]) == (1, 2) and one["local_bytes_per_step"] == 0 < two["local_bytes_per_step"]
    assert summary["steps_per_s_ratio"] > 0 and summary["max_weight_difference"] < 1e-5
