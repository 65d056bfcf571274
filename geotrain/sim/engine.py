"""Discrete-event simulation of a job on a scenario: rounds, churn, repairs, replans, money.

Time advances round by round (a *round* is H inner steps of every pipeline
then the stage groups' all-reduce); peer departures, returns and preemption
bursts are events on a heap, applied at their exact times inside a round.

- Pipelines: each pipeline's inner step comes from the event-level 1F1B
  schedule (``onef1b``) or the planner's closed form, times a lognormal
  straggler factor per round. A pipeline slower than ``deadline_factor`` x
  the median misses the round: its H steps are discarded (the round goes on
  without it, as the sync engine does).
- Hosts (``SimConfig.host``, :mod:`geotrain.sim.host`): peers that share a
  machine's cores step no faster than their CPU work over those cores.
- Rounds: the stage groups' hierarchical all-reduce time and bytes come from
  the planner's cost model for the current plan, plus a fixed
  ``round_overhead_s`` (membership, commit, checkpoint); with overlap, only
  the part longer than the tau inner steps it may run behind
  (``job.overlap_steps``; H when unset) shows.
- A peer that leaves mid-round breaks its pipeline: that pipeline's inner
  progress since the last round is lost (its tokens count as waste). At the
  round boundary the pipeline is repaired from a spare (same region first,
  enough memory, fastest), which pulls the stage's state (weights plus the
  DiLoCo anchor and outer momentum) from the best-connected live member of
  its stage group; the pipeline rejoins when the transfer ends. With no
  fitting spare the pipeline is dropped and the job replans.
- Replans call the real planner (``geotrain.planner.plan``) on the live
  peers, keeping the stage count, at most once per ``replan_every_hours``
  unless a pipeline could not be repaired; a periodic replan is adopted only
  if it beats the running plan by ``replan_gain``; every peer whose layers change
  pulls its new stage's state, and the swarm pauses ``replan_s`` plus the
  slowest transfer.
- Money: the plan's peers' prices while they are in the plan, plus egress
  per region pair for the bytes that crossed.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

from geotrain.errors import InfeasiblePlanError
from geotrain.planner import CostModel, Prediction, Scenario, StageAssignment, plan
from geotrain.sim.config import SimConfig
from geotrain.sim.onef1b import simulate_step, timing_from_plan
from geotrain.sim.result import SimResult

logger = logging.getLogger(__name__)
Pipelines = list[list[StageAssignment]]
STATE_BYTES_PER_PARAM_EXTRA = 8.0  # a joiner pulls weights + DiLoCo anchor and outer momentum (fp32)


class Simulation:
    """One run of :class:`SimConfig` on a scenario; :meth:`run` returns a :class:`SimResult`."""

    def __init__(self, scenario: Scenario, config: SimConfig, *, objective: Any = None,
                 initial_plan: Pipelines | None = None) -> None:
        self.sc = scenario if objective is None else dataclasses.replace(
            scenario, job=dataclasses.replace(scenario.job, objective=_objective(objective)))
        self.cfg = config
        self.cm = CostModel(self.sc)
        self.rng = random.Random(config.seed)
        self.res = SimResult(config=config)
        self.alive: set[str] = {p.id for p in self.sc.peers}
        self.events: list[tuple[float, int, str, str]] = []  # (time, seq, kind, peer or region)
        self._seq = 0
        self.pipelines: Pipelines = []
        self.pred: Prediction | None = None
        self.blocked_until: list[float] = []
        self.host_floor_s: list[float] = []
        self.stages: int | None = self.sc.job.stages
        self.version = 0
        self.last_replan = -math.inf
        self._warned_versions: set[int] = set()
        self._alive_at_plan: frozenset[str] = frozenset()
        self._step_cache: dict[tuple[Any, ...], float] = {}
        self.tokens_per_step = self.cm.M * self.cm.m
        self.H = self.sc.job.sync_every
        # a given first plan (e.g. the one a real run used, for validation) replaces the planner's first call
        self._initial_plan = [list(p) for p in initial_plan] if initial_plan else None

    # -- events -----------------------------------------------------------------------------------
    def _push(self, t: float, kind: str, who: str) -> None:
        heapq.heappush(self.events, (t, self._seq, kind, who))
        self._seq += 1

    def _schedule_leave(self, peer: str, now: float) -> None:
        if self.cfg.churn_per_hour > 0:
            self._push(now + self.rng.expovariate(self.cfg.churn_per_hour) * 3600.0, "leave", peer)

    def _apply_events(self, until: float, broken: dict[int, float]) -> None:
        """Apply departures/returns/bursts up to ``until``; ``broken`` gets pipeline -> time it broke."""
        while self.events and self.events[0][0] <= until:
            t, _, kind, who = heapq.heappop(self.events)
            if kind == "burst":
                region_peers = sorted(q for q in self.alive if self.sc.peer(q).region == who)
                k = math.ceil(self.cfg.burst_fraction * len(region_peers))
                victims = self.rng.sample(region_peers, k) if k else []
                self.res.event(t, "burst", region=who, peers=len(victims))
                for q in victims:
                    self._leave(q, t, broken, burst=True)
                self._push(t + self.rng.expovariate(self.cfg.burst_per_hour) * 3600.0, "burst",
                           self.rng.choice(sorted(self.sc.regions)))
            elif kind == "leave" and who in self.alive:
                self._leave(who, t, broken)
            elif kind == "join":
                self.alive.add(who)
                self.res.joins += 1
                self.res.event(t, "join", peer=who)
                self._schedule_leave(who, t)

    def _leave(self, peer: str, t: float, broken: dict[int, float], *, burst: bool = False) -> None:
        self.alive.discard(peer)
        self.res.departures += 1
        if not burst:
            self.res.event(t, "leave", peer=peer)
        if self.cfg.rejoin_hours > 0:
            self._push(t + self.rng.expovariate(1.0 / self.cfg.rejoin_hours) * 3600.0, "join", peer)
        for i, pipe in enumerate(self.pipelines):
            if any(st.peer == peer for st in pipe):
                broken.setdefault(i, t)

    # -- timing -----------------------------------------------------------------------------------
    def _step_s(self, pipe: Sequence[StageAssignment], closed_form: float) -> float:
        if not self.cfg.exact_pipelines:
            return closed_form + self.cfg.step_overhead_s
        key = tuple((st.peer, st.layers) for st in pipe)
        if key not in self._step_cache:
            self._step_cache[key] = simulate_step(timing_from_plan(self.cm, pipe)) + self.cfg.step_overhead_s
        return self._step_cache[key]

    def _set_plan(self, pipelines: Pipelines, now: float, blocked: list[float] | None = None) -> None:
        self.pipelines = pipelines
        self.blocked_until = blocked if blocked is not None else [now] * len(pipelines)
        pred = self.cm.predict(pipelines, check_memory=True) if pipelines else None
        self.pred = pred if isinstance(pred, Prediction) else None
        host = self.cfg.host
        self.host_floor_s = host.floors(self.cm, pipelines) if host is not None else [0.0] * len(pipelines)
        if pipelines and self.pred is None:
            raise AssertionError(f"simulator built an invalid plan: {pred}")

    def _transfer_s(self, peer: str, layers: tuple[int, int], donors: Sequence[str]) -> float:
        """Seconds for ``peer`` to pull the state of ``layers`` from the best-connected donor."""
        n_params = (self.cm.params[layers[1]] - self.cm.params[layers[0]]) / self.cm.d
        nbytes = n_params * (self.cm.d + STATE_BYTES_PER_PARAM_EXTRA)
        best = math.inf
        for d in donors:
            ln = self.sc.link(peer, d) if d != peer else None
            if ln is not None:
                best = min(best, nbytes / ln.bytes_per_s + ln.rtt_s)
        return best if math.isfinite(best) else 0.0  # no donor left: the stage restarts from the last checkpoint

    # -- planning ---------------------------------------------------------------------------------
    def _replan(self, now: float, reason: str, *, optional: bool = False) -> float:
        """Plan on the live peers with the real planner; returns the pause it costs.

        ``optional`` (a periodic replan while the current plan still runs) keeps the current plan unless
        the new one scores ``replan_gain`` better.
        """
        old = {st.peer: st.layers for pipe in self.pipelines for st in pipe}
        live = [p for p in self.sc.peers if p.id in self.alive]
        self.last_replan = now
        if optional and frozenset(self.alive) == self._alive_at_plan:
            return 0.0  # nobody came or went since the last planner call: it would say the same
        self._alive_at_plan = frozenset(self.alive)
        if not live:
            self._set_plan([], now)
            return 0.0
        job = dataclasses.replace(self.sc.job, stages=self.stages) if self.stages else self.sc.job
        sub = dataclasses.replace(self.sc, peers=tuple(live), job=job)
        try:
            result = plan(sub, seed=self.cfg.seed + self.version, time_budget_s=self.cfg.planner_budget_s,
                          baselines=False, moves=self.cfg.planner_moves)
        except InfeasiblePlanError as e:
            self.res.event(now, "replan_failed", reason=str(e))
            self._set_plan([], now)
            return 0.0
        if optional and self.pred is not None:
            # a periodic replan is adopted only if it beats the running plan clearly: a new plan pauses
            # the swarm and moves state
            obj = self.sc.job.objective
            if obj.score(result.predicted) >= obj.score(self.pred) - self.cfg.replan_gain * abs(obj.score(self.pred)):
                self.res.event(now, "replan_skipped", reason=reason)
                return 0.0
        self.version += 1
        # the first plan is a plan, not a replan
        self.res.plans += 1
        self.res.replans += self.version > 1
        self.stages = self.stages or len(result.pipelines[0])
        pause = self.cfg.replan_s if self.version > 1 else 0.0
        slowest = 0.0
        if self.version > 1:
            holders: dict[tuple[int, int], list[str]] = {}
            for q, lr in old.items():
                if q in self.alive:
                    holders.setdefault(lr, []).append(q)
            for pipe in result.pipelines:
                for st in pipe:
                    if old.get(st.peer) != st.layers:
                        donors = [q for lr, qs in holders.items() if lr[0] <= st.layers[0] < lr[1] for q in qs]
                        slowest = max(slowest, self._transfer_s(st.peer, st.layers, donors))
        self._set_plan(result.pipelines, now, [now + pause + slowest] * len(result.pipelines))
        self.res.event(now, "replan" if self.version > 1 else "plan", version=self.version, reason=reason,
                       pipelines=len(self.pipelines),
                       stages=len(self.pipelines[0]), pause_s=round(pause + slowest, 3))
        return pause + slowest

    def _repair(self, now: float, broken: Sequence[int]) -> bool:
        """Replace dead peers of ``broken`` pipelines with spares; False if one could not be repaired."""
        in_plan = {st.peer for pipe in self.pipelines for st in pipe}
        spares = sorted((q for q in self.alive if q not in in_plan), key=lambda q: (-self.cm.flops_of[q], q))
        ok, keep, blocked = True, [], []
        S = len(self.pipelines[0]) if self.pipelines else 0
        for i, pipe in enumerate(self.pipelines):
            if i not in broken:
                keep.append(pipe)
                blocked.append(self.blocked_until[i])
                continue
            new_pipe, ready = list(pipe), now
            for si, st in enumerate(pipe):
                if st.peer in self.alive:
                    continue
                need = self.cm.stage_memory(st.layers[0], st.layers[1], si, S)
                region = self.sc.peer(st.peer).region
                fits = [q for q in spares if self.sc.peer(q).memory_bytes >= need
                        and all(self.sc.link(q, nb.peer) is not None
                                for nb in (pipe[si - 1] if si else None, pipe[si + 1] if si + 1 < S else None)
                                if nb is not None)]
                if not fits:
                    ok = False
                    break
                pick = next((q for q in fits if self.sc.peer(q).region == region), fits[0])
                spares.remove(pick)
                donors = [p2[si].peer for p2 in self.pipelines if p2[si].peer in self.alive]
                ready = max(ready, now + self._transfer_s(pick, st.layers, donors))
                new_pipe[si] = StageAssignment(peer=pick, layers=st.layers)
                self.res.repairs += 1
                self.res.event(now, "repair", pipeline=i, stage=si, dead=st.peer, spare=pick,
                               transfer_s=round(ready - now, 3))
            else:
                keep.append(new_pipe)
                blocked.append(ready)
                continue
            self.res.event(now, "drop_pipeline", pipeline=i)
        self._set_plan(keep, now, blocked)
        return ok

    # -- the run ----------------------------------------------------------------------------------
    def run(self) -> SimResult:
        cfg, res = self.cfg, self.res
        end = cfg.hours * 3600.0
        for q in sorted(self.alive):
            self._schedule_leave(q, 0.0)
        if cfg.burst_per_hour > 0:
            self._push(self.rng.expovariate(cfg.burst_per_hour) * 3600.0, "burst", self.rng.choice(sorted(self.sc.regions)))
        if self._initial_plan is not None:
            self.version, self.stages, self.last_replan = 1, len(self._initial_plan[0]), 0.0
            self._alive_at_plan = frozenset(self.alive)
            self._set_plan(self._initial_plan, 0.0)
            res.plans += 1
            res.event(0.0, "plan", version=1, reason="given", pipelines=len(self.pipelines),
                      stages=self.stages, pause_s=0.0)
            t = 0.0
        else:
            t = self._replan(0.0, "start")
        while t < end:
            if not self.pipelines or self.pred is None:
                nxt = self.events[0][0] if self.events else end
                res.idle_s += min(nxt, end) - t
                self._apply_events(min(nxt, end), {})
                t = min(nxt, end)
                if t < end:
                    t += self._replan(t, "no plan")
                continue
            t = self._round(t, end)
        res.finish(max(end, t))
        from geotrain.sim.control import control_plane_cost

        # the control plane's cost under the same terms the peers and the coordinator run with
        round_s = res.full_round_s / res.rounds if res.rounds else None
        n, regions = len(self.sc.peers), len(self.sc.regions)
        busy = control_plane_cost(n, regions=regions, round_s=round_s)
        res.control_plane = {
            "bytes_per_peer_s": busy["bytes_per_peer_s"],
            "idle_bytes_per_peer_s": control_plane_cost(n, regions=regions, training=False)["bytes_per_peer_s"],
            "coordinator_bytes_s": busy["coordinator_bytes_s"],
            "coordinator_reads_per_min": busy["coordinator_reads_per_min"],
            "connections_per_node": busy["connections_per_node"],
        }
        return res

    def _round(self, t: float, end: float) -> float:
        cfg, res, pred = self.cfg, self.res, self.pred
        assert pred is not None
        H = self.H
        spans = []
        for i, pipe in enumerate(self.pipelines):
            # the critical path, or the CPU its hosts' peers need per step over their cores, if longer
            step = max(self._step_s(pipe, pred.pipeline_steps_s[i]), self.host_floor_s[i])
            jitter = math.exp(self.rng.gauss(0.0, cfg.straggler_sigma)) if cfg.straggler_sigma else 1.0
            start = max(t, self.blocked_until[i])
            spans.append((start, start + H * step * jitter, step))
        median = statistics.median(e - t for _, e, _ in spans)
        deadline = t + cfg.deadline_factor * median
        done_by = max((e for _, e, _ in spans if e <= deadline), default=deadline)
        round_s = self._round_s(pred)
        # the round starts with the inner steps and its result is due ``hidden_steps`` steps later (tau); the
        # slowest counted pipeline sets the pace
        hide = self.sc.job.hidden_steps
        exposed = max(0.0, round_s - (done_by - t) * hide / H)
        t_end = done_by + exposed
        self._warn_short_lives(t_end - t)
        if t_end > end:
            return self._partial_round(t, end, spans)
        broken: dict[int, float] = {}
        self._apply_events(t_end, broken)
        good = [i for i, (_, e, _) in enumerate(spans) if e <= deadline and (i not in broken or broken[i] > t_end)]
        missed = sum(1 for _, e, _ in spans if e > deadline)
        res.missed_deadlines += missed
        n_good = len(good)
        tokens = n_good * H * self.tokens_per_step
        wasted = 0.0
        for i, (s0, e, step) in enumerate(spans):
            if i in good:
                res.busy_peer_s += H * step * len(self.pipelines[i]) * self._utilisation(i, step)
                continue
            stop = min(e, broken.get(i, e), t_end)
            wasted += max(0.0, stop - s0) / step * self.tokens_per_step
        dt = t_end - t
        frac = n_good / len(self.pipelines)
        billed = sum(self.sc.peer(st.peer).usd_per_hour for pipe in self.pipelines for st in pipe)
        usd = billed * dt / 3600.0
        for key, per_step in pred.bytes_per_region_pair.items():
            nbytes = per_step * H * frac
            res.bytes_per_region_pair[key] = res.bytes_per_region_pair.get(key, 0.0) + nbytes
            usd += nbytes * self.sc.egress_usd_per_gb(*key) / 1e9
        res.billed_peer_s += sum(len(p) for p in self.pipelines) * dt
        res.add_round(t, t_end, tokens=tokens, wasted=wasted, usd=usd, alive=len(self.alive),
                      in_plan=sum(len(p) for p in self.pipelines), pipelines=len(self.pipelines), version=self.version)
        t = t_end
        if t >= end:
            return t
        if broken:
            ok = self._repair(t, sorted(broken))
            if not ok or not self.pipelines:
                return t + self._replan(t, "a pipeline could not be repaired")
        in_plan = sum(len(p) for p in self.pipelines)
        spare_count = len(self.alive) - in_plan
        if spare_count >= (self.stages or 1) and t - self.last_replan >= cfg.replan_every_hours * 3600.0:
            return t + self._replan(t, f"{spare_count} spares", optional=True)
        return t

    def _warn_short_lives(self, round_s: float) -> None:
        """Warn (once per plan) when a round outlasts a pipeline's expected life under the churn given.

        A pipeline of ``k`` peers, each leaving at ``churn_per_hour``, lives ``1 / (k x churn)`` hours
        on average; a round longer than that is lost more often than not, and the summary's tokens
        and waste then describe rounds that almost never finish.
        """
        churn = self.cfg.churn_per_hour
        if churn <= 0 or self.version in self._warned_versions or not self.pipelines:
            return
        k = max(len(pipe) for pipe in self.pipelines)
        life_s = 3600.0 / (k * churn)
        if round_s > life_s:
            self._warned_versions.add(self.version)
            msg = (f"a round takes {round_s / 60:.1f} min but a {k}-peer pipeline lives {life_s / 60:.1f} min on "
                   f"average at churn {churn:g}/h: most rounds will be lost; sync more often (smaller H) or "
                   "lower the churn")
            self.res.warn(msg)
            logger.warning("%s", msg)

    def _partial_round(self, t: float, end: float, spans: Sequence[tuple[float, float, float]]) -> float:
        """The round that the run's end cuts: the inner steps done by ``end`` count as a partial round.

        Their tokens count, pro rata for the step in progress (the steps ran; their round had not
        committed yet), money is billed to
        ``end``, and the round is counted in ``partial_rounds``, not ``rounds``.
        """
        res, pred = self.res, self.pred
        assert pred is not None
        broken: dict[int, float] = {}
        self._apply_events(end, broken)
        tokens = wasted = steps_done = 0.0
        for i, (s0, _e, step) in enumerate(spans):
            stop = min(end, broken.get(i, end))
            # pro rata: a step's microbatches finish one after another through it
            steps = min(float(self.H), max(0.0, (stop - s0) / step))
            if i in broken:
                wasted += steps * self.tokens_per_step
            else:
                tokens += steps * self.tokens_per_step
                res.busy_peer_s += steps * step * len(self.pipelines[i]) * self._utilisation(i, step)
            steps_done += steps
        dt = end - t
        billed = sum(self.sc.peer(st.peer).usd_per_hour for pipe in self.pipelines for st in pipe)
        usd = billed * dt / 3600.0
        per_pipe = steps_done / max(1, len(self.pipelines))
        for key, per_step in pred.bytes_per_region_pair.items():
            # activations flow with the steps done; the round's own bytes never left
            nbytes = per_step * per_pipe
            res.bytes_per_region_pair[key] = res.bytes_per_region_pair.get(key, 0.0) + nbytes
            usd += nbytes * self.sc.egress_usd_per_gb(*key) / 1e9
        res.billed_peer_s += sum(len(p) for p in self.pipelines) * dt
        res.add_round(t, end, tokens=tokens, wasted=wasted, usd=usd, alive=len(self.alive),
                      in_plan=sum(len(p) for p in self.pipelines), pipelines=len(self.pipelines),
                      version=self.version, partial=True)
        return end

    def _round_s(self, pred: Prediction) -> float:
        """Seconds one round takes: the cost model's all-reduce plus the fixed per-round overhead.

        The overhead is part of the round, not of the steps, so overlap hides it like the all-reduce.
        """
        return pred.round_sync_s + self.cfg.round_overhead_s

    def _utilisation(self, i: int, step: float) -> float:
        """Mean busy fraction of pipeline ``i``'s peers during one inner step of ``step`` seconds."""
        comp = [self.cm.stage_compute_s(st.layers[0], st.layers[1], self.cm.flops_of[st.peer]) for st in self.pipelines[i]]
        return min(1.0, self.cm.M * sum(comp) / len(comp) / step)


def _objective(raw: Any) -> Any:
    from geotrain.planner import Objective

    return Objective.parse(raw)


def simulate(scenario: Scenario, config: SimConfig | None = None, *, objective: Any = None,
             initial_plan: Pipelines | None = None) -> SimResult:
    """Simulate ``scenario``'s job under ``config`` (see the module docstring).

    ``initial_plan``: start from these pipelines instead of the planner's first plan (validation
    against a real run uses the plan that run trained with).
    """
    return Simulation(scenario, config or SimConfig(), objective=objective, initial_plan=initial_plan).run()
