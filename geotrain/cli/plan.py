"""``geotrain plan``: what-if planning from a scenario file, with no swarm.

Prints the chosen assignment (pipeline x stage -> peer, region, layers), the
predicted tokens/s, USD/hour, USD per 1M tokens and bytes per region pair, and
the baselines' figures; ``--json`` prints one JSON object instead (shape in
``docs/planner.md``).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from geotrain.errors import ScenarioError
from geotrain.files import read_structured


def register(sub: Any) -> None:
    p = sub.add_parser("plan", help="plan stages and pipelines for a scenario file (what-if, no swarm)")
    p.add_argument("--scenario", required=True, metavar="FILE", help="scenario JSON (see docs/scenario.md)")
    p.add_argument(
        "--objective",
        default=None,
        help=('override job.objective: throughput; cost (the cheapest per token within 10%% of the fastest '
              'plan, = cost=0.1); cost=S (within a fraction S); cost=1 (the cheapest at any speed); '
              'max_usd_per_hour=X; min_tokens_per_s=Y; or JSON'),
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--seed", type=int, default=0, help="seed of the heuristic and the baselines")
    p.add_argument("--time-budget", type=float, default=20.0, metavar="S", help="heuristic search budget, seconds")
    p.add_argument("--no-baselines", action="store_true", help="skip the baselines (faster on large swarms)")
    p.set_defaults(handler=_run)


def load_scenario(path: str) -> Any:
    """Read and parse a scenario file; errors name the file and the field."""
    from geotrain.planner import Scenario

    raw = read_structured(path, what="scenario", fmt="json", error=ScenarioError)
    try:
        return Scenario.from_dict(raw)
    except ScenarioError as e:
        raise ScenarioError(f"{path}: {e}") from None


def _run(args: argparse.Namespace) -> int:
    from geotrain.planner import plan

    sc = load_scenario(args.scenario)
    result = plan(sc, objective=args.objective, seed=args.seed, time_budget_s=args.time_budget,
                  baselines=not args.no_baselines)
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    _render(sc, result)
    return 0


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} TB"


def _render(sc: Any, result: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    pred = result.predicted
    source = "" if result.chosen_from == "search" else f", taken from the {result.chosen_from} baseline"
    floor = result.objective.floor_tokens_per_s
    bound = "" if floor is None else f" (at least {floor:,.0f} tokens/s: within {result.objective.slowdown:.0%} of the fastest)"
    t = Table(title=f"plan ({result.method} search{source}, objective {json.dumps(result.objective.to_json())}{bound}, "
                    f"{result.solve_s:.2f} s)")
    for col in ("pipeline", "stage", "peer", "region", "layers [start, end)", "memory GB (need / has)",
                "utilisation"):
        t.add_column(col)
    memory = result.to_json()["stage_memory_gb"]
    for pi, pipe in enumerate(result.pipelines):
        for si, st in enumerate(pipe):
            mem = memory[pi][si]
            t.add_row(str(pi), str(si), st.peer, sc.peer(st.peer).region, f"[{st.layers[0]}, {st.layers[1]})",
                      f"{mem['need']:.1f} / {mem['have']:g}", f"{pred.utilisation.get(st.peer, 0.0):.0%}")
    console.print(t)
    for q in result.spares:
        console.print(f"spare {q}: {result.spare_reasons.get(q, '')}")
    console.print(f"bottleneck: {pred.bottleneck}; 1F1B step {pred.pipeline_step_s:.3f} s, "
                  f"round sync {pred.round_sync_s:.3f} s ({pred.exposed_sync_s:.3f} s not hidden), "
                  f"a round every {pred.step_s * result.sync_every:.1f} s")
    for note in result.notes:
        console.print(f"note: {note}")
    pairs = Table(title="bytes per inner step by region pair (sender -> receiver)")
    pairs.add_column("from")
    pairs.add_column("to")
    pairs.add_column("bytes/step", justify="right")
    for (a, b), v in sorted(pred.bytes_per_region_pair.items()):
        pairs.add_row(a, b, _fmt_bytes(v))
    console.print(pairs)
    figures = Table(title="predicted (ours) vs baselines, same cost model and shape")
    figures.add_column("plan", no_wrap=True)
    for col in ("tokens/s", "USD/hour", "USD/1M tokens", "step s", "cross-region bytes/step"):
        figures.add_column(col, justify="right")
    rows = [("ours", pred), *result.baselines.items()]
    for name, p in rows:
        if p is None:
            figures.add_row(name, "infeasible", "", "", "", "")
            continue
        mtok = f"{p.usd_per_mtok:.4f}" if math.isfinite(p.usd_per_mtok) else "-"
        figures.add_row(name, f"{p.tokens_per_s:,.0f}", f"{p.usd_per_hour:.2f}", mtok, f"{p.step_s:.3f}",
                        _fmt_bytes(p.cross_region_bytes_per_step))
    console.print(figures)
    for name, why in result.baseline_reasons.items():
        console.print(f"{name} infeasible: {why}")
