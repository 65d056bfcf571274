"""What a simulation reports: a timeline, totals, bytes and money per region pair, events.

*Goodput* is the tokens that made it into a completed round per second of
simulated time; *waste* is work done and then thrown away (a pipeline that
lost a peer mid-round or missed the round's deadline). *Utilisation* is the
peers' compute-busy time over their billed time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from geotrain.sim.config import SimConfig


@dataclass
class SimResult:
    config: SimConfig
    timeline: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    events_total: int = 0
    tokens: float = 0.0
    wasted_tokens: float = 0.0
    usd: float = 0.0
    bytes_per_region_pair: dict[tuple[str, str], float] = field(default_factory=dict)
    busy_peer_s: float = 0.0
    billed_peer_s: float = 0.0
    idle_s: float = 0.0
    rounds: int = 0
    partial_rounds: int = 0  # rounds the run's end cut: their inner steps count, their sync never ran
    full_round_s: float = 0.0  # simulated seconds spent in rounds that finished
    plans: int = 0  # plans adopted, the first one included
    replans: int = 0  # plans adopted after the first
    warnings: list[str] = field(default_factory=list)
    repairs: int = 0
    departures: int = 0
    joins: int = 0
    missed_deadlines: int = 0
    seconds: float = 0.0
    control_plane: dict[str, Any] = field(default_factory=dict)  # geotrain.sim.control, set at the end
    _bucket: dict[str, Any] = field(default_factory=dict, repr=False)

    def event(self, t: float, kind: str, **data: Any) -> None:
        self.events_total += 1
        if len(self.events) < self.config.max_events:
            self.events.append({"t_h": round(t / 3600.0, 4), "event": kind, **data})

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def add_round(self, t0: float, t1: float, *, tokens: float, wasted: float, usd: float, alive: int, in_plan: int,
                  pipelines: int, version: int, partial: bool = False) -> None:
        if partial:
            self.partial_rounds += 1
        else:
            self.rounds += 1
            self.full_round_s += t1 - t0
        self.tokens += tokens
        self.wasted_tokens += wasted
        self.usd += usd
        b = self._bucket
        if not b:
            b.update(t0=t0, tokens=0.0, usd=0.0)
        b["tokens"] += tokens
        b["usd"] += usd
        b.update(alive=alive, in_plan=in_plan, pipelines=pipelines, version=version)
        if t1 - b["t0"] >= self.config.sample_every_s:
            self._flush(t1)

    def _flush(self, t1: float) -> None:
        b = self._bucket
        if not b:
            return
        span = max(t1 - b["t0"], 1e-9)
        self.timeline.append({
            "t_h": round(t1 / 3600.0, 4), "tokens_per_s": b["tokens"] / span, "usd_per_hour": b["usd"] / span * 3600.0,
            "alive": b["alive"], "in_plan": b["in_plan"], "pipelines": b["pipelines"], "plan_version": b["version"],
        })
        self._bucket = {}

    def finish(self, end: float) -> None:
        self._flush(end)
        self.seconds = end

    @property
    def goodput_tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def usd_per_mtok(self) -> float:
        return self.usd / self.tokens * 1e6 if self.tokens else math.inf

    @property
    def utilisation(self) -> float:
        return self.busy_peer_s / self.billed_peer_s if self.billed_peer_s else 0.0

    def summary(self) -> dict[str, Any]:
        cross = sum(v for (a, b), v in self.bytes_per_region_pair.items() if a != b)
        return {
            "hours": self.seconds / 3600.0,
            "tokens": self.tokens,
            "goodput_tokens_per_s": self.goodput_tokens_per_s,
            "wasted_tokens": self.wasted_tokens,
            "waste_fraction": self.wasted_tokens / (self.tokens + self.wasted_tokens) if self.tokens + self.wasted_tokens else 0.0,
            "usd": self.usd,
            "usd_per_mtok": self.usd_per_mtok if math.isfinite(self.usd_per_mtok) else None,
            "utilisation": self.utilisation,
            "cross_region_bytes": cross,
            "rounds": self.rounds,
            "partial_rounds": self.partial_rounds,
            "plans": self.plans,
            "replans": self.replans,
            "repairs": self.repairs,
            "departures": self.departures,
            "joins": self.joins,
            "missed_deadlines": self.missed_deadlines,
            "idle_s": self.idle_s,
            "events": self.events_total,
            **{f"control_{k}": v for k, v in self.control_plane.items()},
            "warnings": list(self.warnings),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "summary": self.summary(),
            "bytes_per_region_pair": {f"{a}->{b}": v for (a, b), v in sorted(self.bytes_per_region_pair.items())},
            "timeline": self.timeline,
            "events": self.events,
        }
