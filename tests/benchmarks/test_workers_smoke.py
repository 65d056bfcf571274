from __future__ import annotations

import pytest

from benchmarks.workers import main


@pytest.mark.timeout(120)
def test_workers_benchmark_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--steps", "4", "--every", "2", "--micro-batch", "2", "--microbatches", "2"]) == 0
    out = capsys.readouterr().out
    assert '"group_globals_identical": true' in out and '"ok": true' in out
