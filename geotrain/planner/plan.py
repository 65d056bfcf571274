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
from geotrain.planner.search import (
    Candidate,
    Scorer,
    add_pipelines,
    can_hold,
    exhaustive,
    exhaustive_size,
    heuristic,
)

logger = logging.getLogger(__name__)

BASELINES = ("random", "round_robin", "greedy_region", "genetic")
CHEAPEST = Objective(kind="cost", value=1.0)  # the cheapest tokens at any speed: a steer for bounded searches


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
    # why each spare is left out, by peer id; why each infeasible baseline found nothing, by name
    spare_reasons: dict[str, str] = field(default_factory=dict)
    baseline_reasons: dict[str, str] = field(default_factory=dict)
    # which search produced the plan: the method's own answer ("search") or a baseline's, when one of
    # them scored better (the plan is the best candidate anything evaluated)
    chosen_from: str = "search"
    notes: tuple[str, ...] = ()  # hints about the answer, e.g. why a cost plan is degenerate
    stage_memory: tuple[tuple[float, ...], ...] = ()  # bytes each stage needs, per pipeline
    sync_every: int = 1
    peer_memory_gb: dict[str, float] = field(default_factory=dict)
    # the search's own answer (with per-pipeline splits or, when better, one split for all), before
    # any of the other baselines could win
    search_predicted: Prediction | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``geotrain plan --json`` object: issue 4's shape, plus what the table shows (docs/planner.md).

        Layers are half-open ``[start, end)``, as everywhere in the planner.
        """
        mem = self.stage_memory or tuple(tuple(0.0 for _ in pipe) for pipe in self.pipelines)
        pred = self.predicted
        return {
            "plan": {
                "pipelines": [[{"peer": st.peer, "layers": [st.layers[0], st.layers[1]]} for st in pipe]
                              for pipe in self.pipelines],
                "spares": list(self.spares),
            },
            # per pipeline, per stage: GB the stage needs (weights, gradients, optimizer and DiLoCo state,
            # activations in flight) and GB its peer has
            "stage_memory_gb": [[{"need": round(need / 1e9, 3), "have": self.peer_memory_gb.get(st.peer, 0.0)}
                                 for st, need in zip(pipe, needs, strict=True)]
                                for pipe, needs in zip(self.pipelines, mem, strict=True)],
            "spare_reasons": {q: self.spare_reasons.get(q, "") for q in self.spares},
            "predicted": pred.to_json() | {
                "bottleneck": pred.bottleneck,
                "utilisation": {q: round(u, 4) for q, u in sorted(pred.utilisation.items())},
                "pipeline_step_s": pred.pipeline_step_s,
                "round_s": pred.step_s * self.sync_every,
                "round_sync_s": pred.round_sync_s,
                "exposed_sync_s": pred.exposed_sync_s,
            },
            "baselines": {k: (None if v is None else v.to_json()) for k, v in self.baselines.items()},
            "baseline_reasons": {k: self.baseline_reasons.get(k, "") for k, v in self.baselines.items() if v is None},
            # the objective as given; ``floor_tokens_per_s``: the speed a ``cost`` plan had to keep (null otherwise)
            "objective": self.objective.to_json(),
            "floor_tokens_per_s": self.objective.floor_tokens_per_s,
            "method": self.method,
            "chosen_from": self.chosen_from,
            "notes": list(self.notes),
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
    exact = exhaustive_size(cm, len(ids)) <= exact_limit
    top: Candidate | None = None
    slowdown = obj.slowdown
    if slowdown is not None and slowdown < 1:
        # a slowdown bound ("cost" alone: 10%): find the fastest plan first, then the cheapest per token
        # within the bound
        fast = Scorer(cm, Objective(kind="throughput"))
        top = exhaustive(fast, ids) if exact else heuristic(fast, ids, seed=seed, time_budget_s=time_budget_s / 3,
                                                            moves=moves)
        if top is not None and not exact:
            top = add_pipelines(fast, top, ids)  # the fastest plan as the throughput objective finds it
        if top is not None:
            obj = dataclasses.replace(obj, floor_tokens_per_s=(1.0 - slowdown) * top.prediction.tokens_per_s)
            scenario = dataclasses.replace(scenario, job=dataclasses.replace(scenario.job, objective=obj))
            cm = CostModel(scenario)
    score = Scorer(cm, obj)
    if obj.floor_tokens_per_s is not None and top is not None:
        # the fastest plan meets the bound: the incumbent to beat (its pipelines may differ in shape)
        score.offer(top)
    if exact:
        method, found = "exact", exhaustive(score, ids)
    elif obj.floor_tokens_per_s is not None:
        method = "heuristic"
        heuristic(score, ids, seed=seed, time_budget_s=time_budget_s / 3, moves=moves)
        cheapest = heuristic(Scorer(cm, CHEAPEST, shared=score), ids, seed=seed,
                             time_budget_s=time_budget_s / 3, moves=moves)
        if cheapest is not None:
            # the cheapest tokens plus as few extra pipelines as the bound needs
            add_pipelines(score, cheapest, ids)
        found = score.incumbent
    elif obj.kind in ("max_usd_per_hour", "min_tokens_per_s"):
        # a bound splits the plans in two; the plans near it are found by searching for speed and for
        # price as well (the incumbent is judged by the bound's objective throughout)
        method = "heuristic"
        third = time_budget_s / 3
        heuristic(score, ids, seed=seed, time_budget_s=third, moves=moves)
        for steer in (Objective(kind="throughput"), CHEAPEST):
            heuristic(Scorer(cm, steer, shared=score), ids, seed=seed, time_budget_s=third, moves=moves)
        found = score.incumbent
    else:
        method, found = "heuristic", heuristic(score, ids, seed=seed, time_budget_s=time_budget_s, moves=moves)
    best = score.incumbent if found is None or (score.incumbent is not None
                                                 and score.incumbent.score < found.score) else found
    rect = best  # the baselines get this one's shape
    if best is not None and not exact:
        # pipelines of other stage counts on the spares (a rectangular grid holds one count)
        best = add_pipelines(score, best, ids)
    solve_s, solve_cpu_s = time.perf_counter() - t0, time.process_time() - c0
    if best is None:
        raise InfeasiblePlanError(f"no feasible plan: {score.last_reason}")
    base: dict[str, Prediction | None] = {}
    base_s: dict[str, float] = {}
    base_cpu: dict[str, float] = {}
    base_why: dict[str, str] = {}
    chosen_from = "search"
    search_pred = best.prediction
    if baselines:
        assert rect is not None
        # the baselines' shape: the plan's most common stage count and its pipelines (rectangular)
        S = max(sorted({len(r) for r in rect.grid}), key=lambda k: sum(len(r) == k for r in rect.grid))
        P = sum(len(r) == S for r in rect.grid)
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
            if c is None:
                base_why[name] = f"no feasible {P} x {S} assignment: {score.last_reason}"
        # the best plan with one split for all pipelines, same cost model and search budget
        t1, c1 = time.perf_counter(), time.process_time()
        uni = Scorer(cm, obj, shared=score, per_pipeline=False)
        if exact:
            c = exhaustive(uni, ids)
        else:
            c = heuristic(uni, ids, seed=seed, time_budget_s=time_budget_s, moves=moves)
        base_s["uniform_split"] = time.perf_counter() - t1
        base_cpu["uniform_split"] = time.process_time() - c1
        base["uniform_split"] = None if c is None else c.prediction
        if c is None:
            base_why["uniform_split"] = f"no feasible plan with one split for all pipelines: {uni.last_reason}"
        elif c.score < best.score:
            search_pred = c.prediction  # the same search, one split: still the search's own answer
        # the plan is the best candidate anything evaluated, baselines included
        inc = score.incumbent
        if inc is not None and inc.score < best.score:
            chosen_from = next((k for k, v in base.items() if v is inc.prediction), "baselines")
            chosen_from = chosen_from.replace("uniform_split", "search")  # the same search, one split
            best = inc
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
    spares = [q for q in ids if q not in used]
    S_best = max(len(row) for row in best.grid)  # the longest pipelines: the smallest stages a spare could hold
    memory = tuple(tuple(cm.stage_memory(st.layers[0], st.layers[1], si, len(pipe)) for si, st in enumerate(pipe))
                   for pipe in best.pipelines)
    return PlanResult(
        pipelines=best.pipelines,
        spares=spares,
        predicted=result_pred,
        baselines=base,
        solve_s=solve_s,
        objective=obj,
        method=method,
        baseline_solve_s=base_s,
        solve_cpu_s=solve_cpu_s,
        baseline_cpu_s=base_cpu,
        spare_reasons={q: _spare_reason(cm, q, S_best, len(best.grid), obj) for q in spares},
        baseline_reasons=base_why,
        chosen_from=chosen_from,
        notes=_notes(scenario, obj, result_pred, best),
        stage_memory=memory,
        sync_every=scenario.job.sync_every,
        peer_memory_gb={q: scenario.peer(q).memory_gb for q in used},
        search_predicted=search_pred,
    )


def _spare_reason(cm: CostModel, q: str, S: int, P: int, obj: Objective) -> str:
    """Why peer ``q`` is not in the plan: it cannot hold a stage, or no plan found with it scored better."""
    peer = cm.sc.peer(q)
    if not can_hold(cm, q, S):
        L = cm.n_layers
        share = max(1, L // S)
        need = cm.stage_memory(L - share, L, S - 1, S)
        return (f"cannot hold a stage of a {S}-stage pipeline (the plan's longest): an even stage ({share} layers) "
                f"needs {need / 1e9:.1f} GB, the peer has {peer.memory_gb:g} GB")
    if obj.kind in ("cost", "min_tokens_per_s") and peer.usd_per_hour > 0:
        return (f"left out for price: no plan found with it ({peer.usd_per_hour:g} USD/hour) "
                "made tokens cheaper")
    return f"not needed: no plan found with it scored better than this {P} x {S} one"


def _notes(sc: Scenario, obj: Objective, pred: Prediction, best: Candidate) -> tuple[str, ...]:
    notes = []
    if obj.kind == "cost" and pred.usd_per_hour == 0:
        n = sum(len(row) for row in best.grid)
        notes.append(
            f"degenerate cost answer: the plan's {n} peer(s) cost 0 USD/hour, so it costs 0 USD per 1M tokens "
            "and no plan can be cheaper; the cost objective then only picks the fastest free plan. "
            'For a budget use {"max_usd_per_hour": X} (most tokens/s under X USD/hour) or '
            '{"min_tokens_per_s": Y}' + ('; "cost" alone keeps within 10% of the fastest plan' if obj.slowdown == 1 else "")
        )
    return tuple(notes)
