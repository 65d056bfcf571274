"""What the planner optimises.

An *objective* is one of:

- ``"throughput"``: most tokens/s (ties: lower USD per 1M tokens);
- ``{"cost": s}`` (``cost=0.1``): lowest USD per 1M tokens among the plans at
  most a fraction ``s`` slower than the fastest plan the search finds
  (``0 < s < 1``; ``s = 1`` is below): cheap tokens without giving up more
  than ``s`` of the speed, and never a degenerate answer such as a free peer alone;
- ``"cost"``: ``cost=0.1`` (:data:`DEFAULT_COST_SLOWDOWN`). The cheapest tokens
  at any speed are often a plan much slower than the fastest (the cheap peers
  alone, the dear ones left out: 20% fewer tokens/s on
  ``heterogeneous_price.json``), which is rarely what "cheap" meant;
- ``{"cost": 1}`` (``cost=1``): lowest USD per 1M tokens at any speed (a
  slowdown of up to 100%). Near-ties go to the faster plan: 10x the tokens/s is
  worth 2% of the price per token (2x: 0.6%), so a flat price curve scales out
  instead of halving speed to save a rounding error; a swarm with free peers
  gets the fastest free plan;
- ``{"max_usd_per_hour": X}``: most tokens/s while the swarm costs at most X USD/hour;
- ``{"min_tokens_per_s": Y}``: the cheapest plan (lowest USD/hour) making at least Y tokens/s; of
  plans at the same price per hour the faster wins. (Per 1M tokens, a swarm that scales linearly
  costs the same at any size, so that measure could not tell 8 peers that meet the bound from 16.)

:meth:`Objective.score` turns a prediction into one number to minimise, with
a constraint violation dominating everything else, so every search (exact,
heuristic, genetic) compares plans the same way.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Protocol

from geotrain.errors import ConfigError

KINDS = ("throughput", "cost", "max_usd_per_hour", "min_tokens_per_s")
# A violated constraint adds this much per relative unit of violation, so any
# plan that meets the constraint beats any plan that does not.
_PENALTY = 1e12
# The cost objective minimises usd_per_mtok * (1 - COST_SPEED_TRADE * log10(tokens/s)).
COST_SPEED_TRADE = 0.02
# ``"cost"`` alone: the cheapest per token among plans at most this fraction slower than the fastest
DEFAULT_COST_SLOWDOWN = 0.1


class _Figures(Protocol):
    @property
    def tokens_per_s(self) -> float: ...
    @property
    def usd_per_hour(self) -> float: ...
    @property
    def usd_per_mtok(self) -> float: ...


@dataclass(frozen=True, kw_only=True)
class Objective:
    """One optimisation target; ``value`` is the bound for the constrained kinds."""

    kind: str = "throughput"
    value: float | None = None
    # ``{"cost": s}`` only, set by the planner once it knows the fastest plan: (1 - s) x its tokens/s
    floor_tokens_per_s: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"objective must be one of {', '.join(KINDS)}; got {self.kind!r}")
        constrained = self.kind in ("max_usd_per_hour", "min_tokens_per_s")
        if constrained and (self.value is None or not self.value > 0):
            raise ConfigError(f"objective {self.kind} needs a positive bound, e.g. {{{self.kind!r}: 40}}")
        if self.kind == "cost" and self.value is not None and not 0 < self.value <= 1:
            raise ConfigError(f"objective cost takes the slowdown it may give up, 0 < s <= 1 (e.g. cost=0.1; "
                              f"cost=1: the cheapest tokens at any speed); got {self.value}")
        if not constrained and self.kind != "cost" and self.value is not None:
            raise ConfigError(f"objective {self.kind!r} takes no bound; got {self.value}")

    @property
    def slowdown(self) -> float | None:
        """For ``cost``: the fraction of the fastest plan's tokens/s it may give up (``"cost"`` alone:
        :data:`DEFAULT_COST_SLOWDOWN`; 1: any); None for the other kinds."""
        if self.kind != "cost":
            return None
        return DEFAULT_COST_SLOWDOWN if self.value is None else self.value

    @classmethod
    def parse(cls, raw: Any) -> Objective:
        """From a scenario/CLI value: a name, a one-key dict, ``name=value`` or a JSON string."""
        if isinstance(raw, Objective):
            return raw
        if raw is None:
            return cls()
        if isinstance(raw, str):
            text = raw.strip()
            if text.startswith("{"):
                try:
                    return cls.parse(json.loads(text))
                except json.JSONDecodeError as e:
                    raise ConfigError(f"objective {raw!r} is not valid JSON: {e}") from None
            if "=" in text:
                key, _, val = text.partition("=")
                return cls.parse({key.strip(): val.strip()})
            return cls(kind=text)
        if isinstance(raw, dict) and len(raw) == 1:
            ((key, val),) = raw.items()
            try:
                bound = float(val)
            except (TypeError, ValueError):
                raise ConfigError(f"objective {key!r} needs a number; got {val!r}") from None
            return cls(kind=str(key), value=bound)
        raise ConfigError(
            'objective must be "throughput", "cost", {"max_usd_per_hour": X} or {"min_tokens_per_s": Y}; '
            f"got {raw!r}"
        )

    def to_json(self) -> str | dict[str, float]:
        if self.value is None:
            return self.kind
        return {self.kind: self.value}

    def violation(self, p: _Figures) -> float:
        """Relative amount by which ``p`` breaks this objective's constraint (0 if it holds)."""
        assert self.value is not None or self.kind in ("throughput", "cost")
        if self.kind == "max_usd_per_hour" and self.value is not None:
            return max(0.0, p.usd_per_hour - self.value) / self.value
        if self.kind == "min_tokens_per_s" and self.value is not None:
            return max(0.0, self.value - p.tokens_per_s) / self.value
        if self.kind == "cost" and self.floor_tokens_per_s:
            return max(0.0, self.floor_tokens_per_s - p.tokens_per_s) / self.floor_tokens_per_s
        return 0.0

    def score(self, p: _Figures) -> float:
        """Lower is better: -tokens/s (throughput, max_usd_per_hour), USD per 1M tokens (cost), USD/hour
        (min_tokens_per_s)."""
        penalty = _PENALTY * (1.0 + self.violation(p)) if self.violation(p) > 0 else 0.0
        if self.kind in ("throughput", "max_usd_per_hour"):
            # tiny tie-break on price so equal-speed plans prefer the cheaper one
            return penalty - p.tokens_per_s + 1e-9 * p.usd_per_mtok
        if self.kind == "min_tokens_per_s":
            # the bill per hour, given the speed asked for; ties go to the faster plan
            return penalty + p.usd_per_hour - 1e-12 * p.tokens_per_s
        # near-equal price per token: the faster plan finishes sooner (see COST_SPEED_TRADE); free plans
        # (0 USD per token) would all tie at 0, so a vanishing term makes the fastest of them win
        return (penalty + p.usd_per_mtok * (1.0 - COST_SPEED_TRADE * math.log10(max(p.tokens_per_s, 1.0)))
                - 1e-12 * p.tokens_per_s)
