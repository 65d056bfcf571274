"""``plan()``: the planner's entry point, and its result.

A *plan* here is the assignment part of geotrain's plan: pipelines of
stages (peer + layer range), the spares, and the cost model's prediction.
The coordinator adds versions, codecs per link and sync groups when it
publishes it.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from geotrain.errors import InfeasiblePlanError
from geotrain.planner import baselines as bl
from geotrain.planner.costmodel import CostModel, Prediction, StageAssignment
from geotrain.planner.objective import Objective
from geotrain.planner.scenario import Scenario
from geotrain.planner.search import Candidate, Scorer, exhaustive, exhaustive_size, heuristic

logger = logging.getLogger(__name__)

BASELINES = ("random", "round_robin", "greedy_region", "genetic")


@dataclass(frozen=True, kw_only=True)
class PlanResult:
    """The chosen plan, its prediction, and the baselines' predictions under the same cost model."""

    pipelines: list[list[StageAssignment]]
    spares: list[str]
    predicted: Prediction
    baselines: dict[str, Prediction | None]
    solve_s: float
    objective: Objective
    method: str  # "exact" or "heuristic"
    baseline_solve_s: dict[str, float] = field(default_factory=dict)
    solve_cpu_s: float = 0.0  # CPU seconds of this process (wall time misleads on a shared machine)
    baseline_cpu_s: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The ``geotrain plan --json`` object (shape fixed by issue 4)."""
        return {
            "plan": {
                "pipelines": [[{"peer": st.peer, "layers": [st.layers[0], st.layers[1]]} for st in pipe]
                              for pipe in self.pipelines],
                "spares": list(self.spares),
            },
            "predicted": self.predicted.to_json(),
            "baselines": {k: (None if v is None else v.to_json()) for k, v in self.baselines.items()},
            "solve_s": self.solve_s,
        }


def _diagnose(sc: Scenario, cm: CostModel) -> None:
    """Raise :class:`InfeasiblePlanError` for what no search can fix: memory and connectivity."""
    biggest = max(sc.peers, key=lambda p: p.memory_bytes)
    for layer in range(cm.n_layers):
        need = cm.stage_memory(layer, layer + 1, 0, 1)
        if need > biggest.memory_bytes:
            raise InfeasiblePlanError(
                f"layer {layer} alone needs {need / 1e9:.1f} GB to train but the largest peer "
                f"({biggest.id}) has {biggest.memory_gb:g} GB: add peers with more memory or use a smaller model"
            )
    # the least memory any split needs: every layer somewhere, one microbatch in flight
    floor = cm.stage_memory(0, cm.n_layers, 0, 1)
    total = sum(p.memory_bytes for p in sc.peers)
    if floor > total:
        raise InfeasiblePlanError(
            f"the model needs at least {floor / 1e9:.1f} GB of peer memory in one pipeline; the swarm has "
            f"{total / 1e9:.1f} GB in all: add peers or use a smaller model"
        )
    regions = sorted({p.region for p in sc.peers})
    peer_linked = {(sc.peer(ln.a).region, sc.peer(ln.b).region) for ln in sc.links if ln.a in sc._peer}
    for r in regions:
        members = [p.id for p in sc.peers if p.region == r]
        if len(members) > 1 and sc.region_link(r, r) is None and (r, r) not in peer_linked:
            raise InfeasiblePlanError(
                f"region {r!r} has {len(members)} peers but no link inside it: add "
                f'{{"a": "{r}", "b": "{r}", "bandwidth_gbps": ..., "rtt_ms": ...}} to links'
            )
    # connected components of regions over region links and peer-pair links
    parent = {r: r for r in regions}

    def find(r: str) -> str:
        while parent[r] != r:
            r = parent[r]
        return r

    for a in regions:
        for b in regions:
            if a < b and (sc.region_link(a, b) is not None or (a, b) in peer_linked or (b, a) in peer_linked):
                parent[find(a)] = find(b)
    comps: dict[str, list[str]] = {}
    for r in regions:
        comps.setdefault(find(r), []).append(r)
    if len(comps) > 1:
        parts = sorted(comps.values())
        raise InfeasiblePlanError(
            f"regions are disconnected: {' | '.join(', '.join(c) for c in parts)}; add a link such as "
            f'{{"a": "{parts[0][0]}", "b": "{parts[1][0]}", "bandwidth_gbps": ..., "rtt_ms": ...}}'
        )


def plan(
    scenario: Scenario,
    *,
    objective: Objective | str | dict[str, float] | None = None,
    seed: int = 0,
    exact_limit: int = 5000,
    time_budget_s: float = 20.0,
    baselines: bool = True,
    genetic: bl.GeneticConfig | None = None,
    moves: int | None = None,
) -> PlanResult:
    """Choose stages, pipelines, peers and layer splits for ``scenario``.

    ``objective`` overrides ``scenario.job.objective``. Exact search when it
    would score at most ``exact_limit`` grids, else the heuristic (bounded by
    ``time_budget_s``; ``moves`` caps each local search's evaluations, which
    keeps repeated calls cheap and deterministic). Baselines get the chosen
    shape (see ``baselines``).
    Raises :class:`InfeasiblePlanError` naming what is missing.
    """
    obj = scenario.job.objective if objective is None else Objective.parse(objective)
    if obj != scenario.job.objective:
        scenario = dataclasses.replace(scenario, job=dataclasses.replace(scenario.job, objective=obj))
    t0, c0 = time.perf_counter(), time.process_time()
    cm = CostModel(scenario)
    _diagnose(scenario, cm)
    ids = sorted(p.id for p in scenario.peers)
    score = Scorer(cm, obj)
    if exhaustive_size(cm, len(ids)) <= exact_limit:
        method, best = "exact", exhaustive(score, ids)
    else:
        method, best = "heuristic", heuristic(score, ids, seed=seed, time_budget_s=time_budget_s, moves=moves)
    solve_s, solve_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    if best is None:
        raise InfeasiblePlanError(f"no feasible plan: {score.last_reason}")
    if obj.violation(best.prediction) > 0:
        p = best.prediction
        raise InfeasiblePlanError(
            f"no plan meets {obj.to_json()}: the best found makes {p.tokens_per_s:.0f} tokens/s at "
            f"{p.usd_per_hour:.2f} USD/hour; relax the objective or add peers"
        )
    logger.info("planned %s in %.3fs with %d evaluations (%s)", scenario.job.objective, solve_s, score.evaluations, method)
    result_pred = cm.predict(best.pipelines, detail=True)
    assert isinstance(result_pred, Prediction)
    used = {q for row in best.grid for q in row}
    base: dict[str, Prediction | None] = {}
    base_s: dict[str, float] = {}
    base_cpu: dict[str, float] = {}
    if baselines:
        S, P = len(best.grid[0]), len(best.grid)
        for name in BASELINES:
            t1, c1 = time.perf_counter(), time.process_time()
            c: Candidate | None
            if name == "random":
                c = bl.random_baseline(score, ids, S, P, seed=seed)
            elif name == "round_robin":
                c = bl.round_robin(score, ids, S, P)
            elif name == "greedy_region":
                c = bl.greedy_region(score, ids, S, P)
            else:
                c = bl.genetic(score, ids, S, P, seed=seed, config=genetic)
            base_s[name] = time.perf_counter() - t1
            base_cpu[name] = time.process_time() - c1
            base[name] = None if c is None else c.prediction
    return PlanResult(
        pipelines=best.pipelines,
        spares=[q for q in ids if q not in used],
        predicted=result_pred,
        baselines=base,
        solve_s=solve_s,
        objective=obj,
        method=method,
        baseline_solve_s=base_s,
        solve_cpu_s=solve_cpu_s,
        baseline_cpu_s=base_cpu,
    )
