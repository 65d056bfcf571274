"""The inner learning rate as a pure function of the job's inner step.

Every stage of every pipeline computes the rate of step ``s`` from ``s`` alone,
so stages agree without talking, and a replan or a resume (which restart the
inner optimizer at the plan's start step) continue the same curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from geotrain.errors import ConfigError

__all__ = ["LRSchedule"]


@dataclass(frozen=True, kw_only=True)
class LRSchedule:
    """Linear warm-up over ``warmup_steps``, then ``kind`` decay to ``lr * min_lr_ratio`` at ``decay_steps``.

    ``constant`` keeps ``lr`` after the warm-up. Past ``decay_steps`` the rate stays at its floor.
    """

    lr: float
    warmup_steps: int = 0
    kind: Literal["constant", "cosine", "linear"] = "constant"
    decay_steps: int | None = None
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.warmup_steps < 0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"learning-rate schedule: lr > 0, warmup_steps >= 0, min_lr_ratio in [0, 1]; got {self}")
        if self.kind not in ("constant", "cosine", "linear"):
            raise ConfigError(f"optimizer.schedule must be constant, cosine or linear; got {self.kind!r}")
        if self.kind != "constant" and (self.decay_steps is None or self.decay_steps < 1):
            raise ConfigError(f"optimizer.schedule = {self.kind!r} needs decay_steps >= 1 (or stop.steps)")

    def at(self, step: int) -> float:
        """The rate of inner step ``step`` (0-based: the first step of a job is step 0)."""
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.kind == "constant":
            return self.lr
        assert self.decay_steps is not None
        span = max(1, self.decay_steps - self.warmup_steps)
        progress = min(1.0, max(0.0, (step - self.warmup_steps) / span))
        floor = self.min_lr_ratio
        if self.kind == "cosine":
            scale = floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
        else:
            scale = 1.0 - (1.0 - floor) * progress
        return self.lr * scale
