"""CI smoke of ``python -m benchmarks.sim`` at a tiny size (the grid part only: no pipeline runs)."""

from __future__ import annotations

import json

from benchmarks.sim import main


def test_sim_benchmark_smoke(capsys):
    assert main(["--parts", "grid", "--grid-peers", "8", "--hours", "1"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(lines) == 6 and {x["objective"] for x in lines} == {"throughput", "cost"}
    assert {x["churn_per_hour"] for x in lines} == {0.0, 0.1, 0.3}
    assert all(x["goodput_tokens_per_s"] >= 0 for x in lines)
