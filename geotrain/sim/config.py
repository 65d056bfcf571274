"""The simulator's configuration: how long, how much churn, how the swarm reacts."""

from __future__ import annotations

from dataclasses import dataclass

from geotrain.errors import ConfigError
from geotrain.sim.host import HostModel


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    """One simulated job.

    *Churn* is a hazard: with ``churn_per_hour = 0.1`` each peer leaves with
    probability ~10% per hour (mean lifetime 10 h), then comes back after a
    mean ``rejoin_hours`` (0: never). A *preemption burst* takes
    ``burst_fraction`` of one region's live peers at once (spot reclaim).
    """

    hours: float = 24.0
    churn_per_hour: float = 0.0
    rejoin_hours: float = 0.5
    burst_per_hour: float = 0.0
    burst_fraction: float = 0.3
    straggler_sigma: float = 0.05  # lognormal spread of each pipeline's round time
    deadline_factor: float = 1.5  # a pipeline slower than this x the median pipeline misses the round
    replan_every_hours: float = 1.0  # at most one replan per period, unless a pipeline cannot be repaired
    replan_s: float = 30.0  # publishing a plan and reconnecting, per replan
    replan_gain: float = 0.02  # a periodic replan must beat the running plan's score by this fraction
    planner_budget_s: float = 60.0  # wall-clock safety cap of the real planner per replan
    planner_moves: int = 200  # local-search evaluations per replan: bounds its cost, keeps runs deterministic
    # fixed seconds per inner step on top of compute and links: optimizer step, data loading, framing,
    # bookkeeping threads; 0 for large models, measured by ``benchmarks.simval`` for small ones
    step_overhead_s: float = 0.0
    # fixed seconds per DiLoCo round beyond the modelled all-reduce: round membership over the DHT, the commit,
    # a checkpoint; part of the round's time, so it stalls the pipelines unless the round overlaps compute.
    # Groups run their rounds at once, so it is paid once per round. ``benchmarks.simval`` fits it with
    # ``step_overhead_s`` from runs at two H (per-step time = a + b / H)
    round_overhead_s: float = 0.0
    # peers sharing a machine's cores (an emulated swarm on one box, CPU peers): the CPU floor under a step;
    # None: every peer has a machine of its own
    host: HostModel | None = None
    exact_pipelines: bool = True  # time pipelines with the event-level 1F1B (else the planner's closed form)
    sample_every_s: float = 600.0
    max_events: int = 2000  # events kept in the result (all are counted)
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.hours > 0:
            raise ConfigError(f"sim hours must be > 0; got {self.hours}")
        for name in ("churn_per_hour", "rejoin_hours", "burst_per_hour", "straggler_sigma", "replan_s", "replan_gain",
                     "step_overhead_s", "round_overhead_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"sim {name} must be >= 0; got {getattr(self, name)}")
        if not 0 < self.burst_fraction <= 1:
            raise ConfigError(f"sim burst_fraction must be in (0, 1]; got {self.burst_fraction}")
        if self.deadline_factor < 1:
            raise ConfigError(f"sim deadline_factor must be >= 1 (1.5 lets a pipeline run 50% late); got {self.deadline_factor}")
        if not self.replan_every_hours > 0 or not self.planner_budget_s > 0 or not self.sample_every_s > 0:
            raise ConfigError("sim replan_every_hours, planner_budget_s and sample_every_s must be > 0")
        if self.planner_moves < 1:
            raise ConfigError(f"sim planner_moves must be >= 1; got {self.planner_moves}")
