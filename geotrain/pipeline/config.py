"""Configuration of one stage's runtime in one pipeline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from geotrain.errors import ConfigError
from geotrain.pipeline.lr import LRSchedule

__all__ = ["StageConfig"]


@dataclass(frozen=True, kw_only=True)
class StageConfig:
    """How one stage runs its inner steps.

    ``stage`` is this stage's index among ``num_stages`` in pipeline ``pipeline``.
    ``act_codec`` is the codec of the activations this stage sends forward (the
    hop ``stage -> stage + 1``); ``grad_codec`` that of the activation gradients
    it sends backward (the hop ``stage - 1 <- stage``). Both come from the plan.
    ``targets_from_first``: the last stage receives targets from the first stage
    (one small int64 message per step) instead of reading its own data.
    ``hop_timeout_s``: how long to wait for a neighbour's message before the
    step fails with :class:`~geotrain.errors.StageFailedError`.
    """

    job: str
    plan_version: int = 0
    pipeline: int = 0
    stage: int
    num_stages: int
    microbatches: int = 4
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    max_in_flight: int | None = None
    act_codec: str = "none"
    grad_codec: str = "none"
    targets_from_first: bool = False
    hop_timeout_s: float = 30.0
    send_queue: int = 16
    lr: float = 3e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    lr_schedule: LRSchedule | None = None
    compute_dtype: Literal["fp32", "bf16"] = "fp32"

    def __post_init__(self) -> None:
        if not self.job:
            raise ConfigError("pipeline.job must name the job (messages of other jobs are dropped)")
        if self.num_stages < 1:
            raise ConfigError(f"pipeline.num_stages must be >= 1; got {self.num_stages}")
        if not 0 <= self.stage < self.num_stages:
            raise ConfigError(f"pipeline.stage must be in [0, {self.num_stages}); got {self.stage}")
        if self.microbatches < 1:
            raise ConfigError(f"pipeline.microbatches must be >= 1; got {self.microbatches}")
        if self.schedule not in ("1f1b", "gpipe"):
            raise ConfigError(f"pipeline.schedule must be '1f1b' or 'gpipe'; got {self.schedule!r}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ConfigError(f"pipeline.max_in_flight must be >= 1 or unset; got {self.max_in_flight}")
        if self.hop_timeout_s <= 0:
            raise ConfigError(f"pipeline.hop_timeout_s must be > 0; got {self.hop_timeout_s}")
        if self.send_queue < 1:
            raise ConfigError(f"pipeline.send_queue must be >= 1; got {self.send_queue}")
        if self.compute_dtype not in ("fp32", "bf16"):
            raise ConfigError(f"model.dtype must be 'fp32' or 'bf16'; got {self.compute_dtype!r}")
        if self.lr <= 0 or self.weight_decay < 0:
            raise ConfigError("pipeline.lr must be > 0 and pipeline.weight_decay >= 0")

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1
