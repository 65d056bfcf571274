"""CI smoke of ``python -m benchmarks.planner`` at a tiny size."""

from __future__ import annotations

import json

from benchmarks.planner import main


def test_planner_benchmark_smoke(capsys):
    assert main(["--gpus", "8", "--large", "24", "--hetero", "3", "--ga-budget", "1", "--ga-generations", "5",
                 "--time-budget", "2", "--generated", "3", "--sim-hours", "0.2", "--repeat", "1"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    plans = [x for x in lines if "plan" in x]
    assert {x["plan"] for x in plans} == {"ours", "random", "round_robin", "greedy_region", "genetic", "uniform_split"}
    assert {x["scenario"] for x in plans} >= {f"dtfm_case{i}" for i in range(1, 6)} | {"heterogeneous_price", "large_24"}
    targets = lines[-1]
    assert targets["targets"] is True and targets["large_solve_s"] is not None
    assert targets["generated_scenarios"] >= 1 and targets["generated_worst_ours_over_best_baseline"] <= 1 + 1e-9
    assert any(x["scenario"] == "generated_uneven64" for x in lines)
    assert "generated_no_baseline_meets_objective" in targets
    price = next(x for x in lines if "cost_vs_throughput_usd_per_mtok_cut" in x)
    # plain cost keeps within 10% of the fastest plan; cost=1 (the cheapest at any speed) is reported beside it
    assert price["cost_vs_throughput_tokens_per_s_loss"] <= 0.1 + 1e-9
    assert "cost_1_vs_throughput_tokens_per_s_loss" in price
    assert targets["mix_uniform_split_gain"] >= 1.2 and targets["mix_simulated_within_15pct"] is True
    assert all(x["ours_over_genetic_cost"] is None or x["ours_over_genetic_cost"] > 0 for x in lines if x.get("summary")
               and "ours_over_genetic_cost" in x)
