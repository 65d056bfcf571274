"""Planner benchmark: ours against the baselines on DT-FM's scenarios, prices, and a large swarm.

``python -m benchmarks.planner`` prints one JSON line per (scenario, plan) with
the objective's figures and solve time, then one summary line per scenario
comparing ours with the genetic baseline (measured in the same run) and a
final line with the issue's targets:

- ours <= the genetic baseline's cost (objective value) on DT-FM's five cases,
  in <= 1/20 of its time (compared in CPU seconds: wall time on a shared
  machine mostly measures the neighbours; both are printed; ours is the
  fastest of ``--repeat`` identical runs, the genetic search's one long run);
- 64 peers planned in < 15 s, 1,000 peers in < 60 s;
- on the heterogeneous-price scenario the cost objective cuts USD per 1M
  tokens >= 30% against the throughput objective at <= 10% fewer tokens/s
  (plain ``cost``, which is ``cost=0.1``: the cheapest per token within 10% of
  the fastest plan; ``cost=1``, the cheapest at any speed, is printed beside it);
- on the heterogeneous mix (``heterogeneous_mix.json``) per-pipeline splits
  make >= 1.2x the ``uniform_split`` baseline's tokens/s (``uniform_split_gain``,
  printed for every scenario), and the simulator plays the chosen plan within
  15% of the prediction;
- on a batch of generated scenarios (``geotrain.planner.generate``, seeds
  0..N-1) and issue 20's uneven 64-peer swarm the chosen plan is never worse
  than the best baseline: the worst ratio of ours to the best baseline (objective
  value, lower is better; <= 1 means ours is at least as good) is printed for
  the chosen plan and for the search's own answer before baselines could win.

Keep CI on ``--gpus 8 --large 40 --hetero 4 --ga-budget 2``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from typing import Any

from geotrain.errors import InfeasiblePlanError
from geotrain.planner import Scenario, plan
from geotrain.planner.baselines import GeneticConfig
from geotrain.planner.catalog import dtfm_scenario, heterogeneous_price, large_swarm
from geotrain.planner.generate import heterogeneous_mix, random_scenario, uneven_swarm
from geotrain.planner.plan import PlanResult


def _emit(rec: dict[str, Any]) -> None:
    print(json.dumps(rec), flush=True)


def _line(scenario: str, who: str, objective: str, pred: Any, solve_s: float, n: int, cpu_s: float) -> dict[str, Any]:
    rec: dict[str, Any] = {"scenario": scenario, "peers": n, "plan": who, "objective": objective,
                           "solve_s": round(solve_s, 4), "cpu_s": round(cpu_s, 4)}
    if pred is None:
        rec["feasible"] = False
        return rec
    rec.update(feasible=True, tokens_per_s=round(pred.tokens_per_s, 1), usd_per_hour=round(pred.usd_per_hour, 3),
               usd_per_mtok=round(pred.usd_per_mtok, 5) if math.isfinite(pred.usd_per_mtok) else None,
               step_s=round(pred.step_s, 4), cross_region_bytes_per_step=round(pred.cross_region_bytes_per_step))
    return rec


def _value(objective: str, pred: Any) -> float:
    """The objective as a cost to minimise: seconds per token, or USD per 1M tokens."""
    if pred is None:
        return math.inf
    if objective == "min_tokens_per_s":
        return pred.usd_per_hour
    return pred.usd_per_mtok if objective.startswith("cost") else 1.0 / pred.tokens_per_s


def generated(count: int, args: argparse.Namespace) -> dict[str, Any]:
    """Ours against the best baseline on ``count`` generated scenarios plus the uneven 64-peer swarm."""
    ga = GeneticConfig(time_budget_s=min(args.ga_budget, 5.0), generations=min(args.ga_generations, 40))
    worst_chosen = worst_search = 0.0
    worst_seed: Any = None
    taken_from_baseline = planned = no_baseline = 0
    cases: list[tuple[Any, dict[str, Any]]] = [(seed, random_scenario(seed)) for seed in range(count)]
    cases.append(("uneven64", uneven_swarm(0)))
    for seed, d in cases:
        sc = Scenario.from_dict(d)
        try:
            res = plan(sc, seed=args.seed, time_budget_s=min(args.time_budget, 10.0), genetic=ga)
        except InfeasiblePlanError:
            continue
        kind = res.objective.kind
        # the classic baselines; uniform_split is our own search with one split. A baseline that breaks the
        # objective's bound (``cost`` keeps within 10% of the fastest plan) is no plan for it
        base = [_value(kind, p) for k, p in res.baselines.items()
                if p is not None and k != "uniform_split" and res.objective.violation(p) == 0]
        if not base:
            # ours meets the objective and no baseline does (they share its bound: ``cost`` within 10% of
            # the fastest plan), or every baseline is infeasible: nothing to compare with
            no_baseline += 1
            _emit({"scenario": f"generated_{seed}", "peers": len(sc.peers), "objective": kind,
                   "ours_over_best_baseline": None, "baselines_meeting_objective": 0,
                   "chosen_from": res.chosen_from, "solve_s": round(res.solve_s, 3)})
            continue
        planned += 1
        best = min(base)
        chosen, search = _value(kind, res.predicted), _value(kind, res.search_predicted)
        taken_from_baseline += res.chosen_from != "search"
        _emit({"scenario": f"generated_{seed}", "peers": len(sc.peers), "objective": kind,
               "ours_over_best_baseline": round(chosen / best, 4), "search_over_best_baseline": round(search / best, 4),
               "chosen_from": res.chosen_from, "solve_s": round(res.solve_s, 3)})
        if search / best > worst_search:
            worst_search, worst_seed = search / best, seed
        worst_chosen = max(worst_chosen, chosen / best)
    return {"generated_scenarios": planned, "generated_worst_ours_over_best_baseline": round(worst_chosen, 4),
            "generated_worst_search_over_best_baseline": round(worst_search, 4), "generated_worst_seed": worst_seed,
            "generated_taken_from_baseline": taken_from_baseline, "generated_no_baseline_meets_objective": no_baseline}


def run_one(name: str, d: dict[str, Any], objective: str, args: argparse.Namespace, *, baselines: bool = True) -> PlanResult:
    sc = Scenario.from_dict(d)
    ga = GeneticConfig(time_budget_s=args.ga_budget, generations=args.ga_generations)
    res = plan(sc, objective=objective, seed=args.seed, time_budget_s=args.time_budget, baselines=baselines, genetic=ga)
    for _ in range(args.repeat - 1):
        # our search takes a fraction of a second, so a neighbour's burst on a shared machine can double
        # it; the fastest of a few identical runs (same seed, same search) is its time, as timeit does
        again = plan(sc, objective=objective, seed=args.seed, time_budget_s=args.time_budget, baselines=False)
        res = dataclasses.replace(res, solve_s=min(res.solve_s, again.solve_s),
                                  solve_cpu_s=min(res.solve_cpu_s, again.solve_cpu_s))
    n = len(sc.peers)
    _emit(_line(name, "ours", objective, res.predicted, res.solve_s, n, res.solve_cpu_s) | {
        "method": res.method, "pipelines": len(res.pipelines), "stages": len(res.pipelines[0]), "spares": len(res.spares)})
    for who, pred in res.baselines.items():
        _emit(_line(name, who, objective, pred, res.baseline_solve_s[who], n, res.baseline_cpu_s[who]))
    if baselines:
        ga_pred = res.baselines["genetic"]
        ours_v, ga_v = _value(objective, res.predicted), _value(objective, ga_pred)
        _emit({"scenario": name, "summary": True, "objective": objective,
               "ours_over_genetic_cost": round(ours_v / ga_v, 4) if math.isfinite(ga_v) else None,
               "ours_over_genetic_time": round(res.solve_s / max(res.baseline_solve_s["genetic"], 1e-9), 4),
               "ours_over_genetic_cpu": round(res.solve_cpu_s / max(res.baseline_cpu_s["genetic"], 1e-9), 4),
               "ours_over_greedy_region_cost": _ratio(ours_v, _value(objective, res.baselines["greedy_region"])),
               "ours_over_random_cost": _ratio(ours_v, _value(objective, res.baselines["random"])),
               "uniform_split_gain": _gain(res)})
    return res


def _ratio(ours: float, theirs: float) -> float | None:
    """``ours / theirs``, or None when the baseline found no plan."""
    return round(ours / theirs, 4) if math.isfinite(theirs) else None


def _gain(res: PlanResult) -> float | None:
    """Chosen plan's predicted tokens/s over the ``uniform_split`` baseline's (one split for all pipelines)."""
    uni = res.baselines.get("uniform_split")
    return None if uni is None else round(res.predicted.tokens_per_s / uni.tokens_per_s, 4)


def sim_check(name: str, d: dict[str, Any], res: PlanResult, hours: float) -> dict[str, Any]:
    """Play the chosen plan in the simulator (1F1B event by event, no churn): its tokens/s over the prediction."""
    from geotrain.sim import SimConfig, simulate

    sc = Scenario.from_dict(d)
    out = simulate(sc, SimConfig(hours=hours, straggler_sigma=0.0), initial_plan=res.pipelines)
    ratio = out.goodput_tokens_per_s / res.predicted.tokens_per_s
    rec = {"scenario": name, "simulated": True, "simulated_tokens_per_s": round(out.goodput_tokens_per_s, 1),
           "predicted_tokens_per_s": round(res.predicted.tokens_per_s, 1), "simulated_over_predicted": round(ratio, 4),
           "within_15pct": abs(ratio - 1) <= 0.15}
    _emit(rec)
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.planner", description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=64, help="GPUs in each DT-FM scenario (paper: 64)")
    ap.add_argument("--large", type=int, default=1000, help="peers in the large-swarm scenario (0: skip)")
    ap.add_argument("--hetero", type=int, default=24, help="spot peers per region in the price scenario")
    ap.add_argument("--ga-budget", type=float, default=120.0, help="genetic baseline's time cap, seconds")
    ap.add_argument("--ga-generations", type=int, default=300)
    ap.add_argument("--time-budget", type=float, default=40.0, help="our heuristic's time cap, seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--generated", type=int, default=40, help="generated scenarios to compare on (0: skip)")
    ap.add_argument("--repeat", type=int, default=3, help="our search's time: the fastest of this many runs")
    ap.add_argument("--sim-hours", type=float, default=1.0, help="simulated hours of the mixed swarm's chosen plan")
    args = ap.parse_args(argv)

    ok_cost, ok_time, worst_64, worst_64_cpu = True, True, 0.0, 0.0
    for case in range(1, 6):
        res = run_one(f"dtfm_case{case}", dtfm_scenario(case, args.gpus), "throughput", args)
        ga = res.baselines["genetic"]
        ok_cost &= _value("throughput", res.predicted) <= _value("throughput", ga) * (1 + 1e-9)
        ok_time &= res.solve_cpu_s * 20 <= res.baseline_cpu_s["genetic"]
        worst_64 = max(worst_64, res.solve_s)
        worst_64_cpu = max(worst_64_cpu, res.solve_cpu_s)

    hetero = heterogeneous_price(spot_per_region=args.hetero, top_up=max(1, args.hetero // 3))
    fast = run_one("heterogeneous_price", hetero, "throughput", args)
    cheap = run_one("heterogeneous_price", hetero, "cost", args)
    cut = 1 - cheap.predicted.usd_per_mtok / fast.predicted.usd_per_mtok
    slower = 1 - cheap.predicted.tokens_per_s / fast.predicted.tokens_per_s
    # the cheapest tokens at any speed: the spot V100s alone, for comparison
    anyspeed = run_one("heterogeneous_price", hetero, "cost=1", args)
    cut_1 = 1 - anyspeed.predicted.usd_per_mtok / fast.predicted.usd_per_mtok
    slower_1 = 1 - anyspeed.predicted.tokens_per_s / fast.predicted.tokens_per_s
    _emit({"scenario": "heterogeneous_price", "summary": True, "cost_vs_throughput_usd_per_mtok_cut": round(cut, 4),
           "cost_vs_throughput_tokens_per_s_loss": round(slower, 4),
           "cost_1_vs_throughput_usd_per_mtok_cut": round(cut_1, 4),
           "cost_1_vs_throughput_tokens_per_s_loss": round(slower_1, 4)})

    mix = heterogeneous_mix()
    mixed = run_one("heterogeneous_mix", mix, "throughput", args)
    mix_gain = _gain(mixed)
    mix_sim = sim_check("heterogeneous_mix", mix, mixed, hours=args.sim_hours)

    large_s = large_cpu = None
    if args.large:
        big = run_one(f"large_{args.large}", large_swarm(args.large), "throughput", args)
        large_s, large_cpu = big.solve_s, big.solve_cpu_s

    gen = generated(args.generated, args) if args.generated else {}

    _emit({"targets": True, **gen,
           "dtfm_ours_cost_le_genetic": ok_cost,
           "dtfm_ours_cpu_le_genetic_over_20": ok_time,
           "dtfm_worst_solve_s": round(worst_64, 3), "dtfm_worst_cpu_s": round(worst_64_cpu, 3),
           "dtfm_under_15s": worst_64 < 15,
           "large_solve_s": None if large_s is None else round(large_s, 3),
           "large_cpu_s": None if large_cpu is None else round(large_cpu, 3),
           "large_under_60s": None if large_s is None else large_s < 60,
           "mix_uniform_split_gain": mix_gain, "mix_gain_ge_1.2": mix_gain is not None and mix_gain >= 1.2,
           "mix_simulated_over_predicted": mix_sim["simulated_over_predicted"],
           "mix_simulated_within_15pct": mix_sim["within_15pct"],
           "hetero_cut_ge_30pct": cut >= 0.30, "hetero_loss_le_10pct": slower <= 0.10})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
