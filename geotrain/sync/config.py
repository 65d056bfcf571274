"""The one config of a stage group's DiLoCo sync.

What is an *outer step* (or *round*)? Every ``every`` inner steps, the peers of
a stage group turn what they learnt locally into a *pseudo-gradient*
(``global - local``), average it over the group and feed it to an *outer
optimizer* (SGD with Nesterov momentum by default) that moves the shared
*global* parameters (DiLoCo, Douillard et al., arXiv 2311.08105).

What is a *fragment*? A slice of the stage's parameters with its own round
schedule. With ``fragments = F`` the fragments sync at staggered inner steps
and each round runs in the background; its result is applied ``overlap``
(tau) inner steps later, mixed into the local weights with ``mixing`` (alpha)
(Streaming DiLoCo, Douillard et al., arXiv 2501.18512).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from geotrain.config import DEFAULT_SYNC_EVERY, check_mixing
from geotrain.errors import ConfigError

__all__ = ["DiLoCoConfig", "Aggregation", "Backend"]

Aggregation = Literal["mean", "trimmed_mean", "centered_clip"]
Backend = Literal["geotrain", "hivemind"]


@dataclass(frozen=True, kw_only=True)
class DiLoCoConfig:
    """How a stage group syncs. Defaults follow DiLoCo (H=500 in the paper; smaller suits CPUs: ``every``
    defaults to :data:`geotrain.config.DEFAULT_SYNC_EVERY`, as the job file's ``sync.every`` does).

    - ``every`` (H): inner steps between two rounds of the same fragment.
    - ``outer_lr``, ``outer_momentum``, ``nesterov``: the outer SGD (0.7, 0.9, True in DiLoCo).
    - ``intra_codec`` / ``cross_codec``: codec specs for hops inside a region and
      between regions (see :func:`geotrain.compression.get_codec`). The result comes
      back as the shard owners' own encodings, decoded by every member alike, so
      every member ends bit-identical.
    - ``error_feedback``: keep each peer's compression residual (per fragment) and
      add it to the next round's payload, so compression error is delayed, not lost.
    - ``hierarchical``: reduce within each region first and cross regions once per
      region; ``False`` treats every peer as its own region (flat all-reduce).
    - ``fragments`` (F), ``overlap`` (tau), ``mixing`` (alpha): streaming, see the module docstring.
      ``overlap = 0`` blocks in :meth:`after_inner_step` until the round is done.
    - ``deadline_floor_s``, ``deadline_slack``, ``bandwidth_bytes_per_s``: a round's
      deadline is ``max(floor, slack * payload bytes / bandwidth)``; the bandwidth
      estimate is refined from each round's measured transfer.
    - ``quorum``: fraction of the round's members whose pseudo-gradients must be
      counted for the round to commit; otherwise it is discarded.
    - ``aggregation``: "mean", "trimmed_mean" (drop ``trim_fraction`` of the values
      at each end, per coordinate) or "centered_clip" (Karimireddy et al. 2021, as
      used against Byzantine peers by Gorbunov et al. 2022) with ``clip_iters``.
    - ``max_norm``: a pseudo-gradient with a larger L2 norm is excluded (None = no
      absolute cap); ``max_norm_ratio``: excluded when above this multiple of the
      median norm among at least 3 contributions seen together.
    - ``backend``: "geotrain" (this package's hierarchical all-reduce) or
      "hivemind" (flat, hivemind's DecentralizedAverager: the OpenDiLoCo baseline).
    - ``group``: the stage group's name, stamped on every message of its rounds.
    """

    every: int = DEFAULT_SYNC_EVERY
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    intra_codec: str = "none"
    cross_codec: str = "int8"
    error_feedback: bool = True
    hierarchical: bool = True
    fragments: int = 1
    overlap: int = 0
    mixing: float = 0.5
    deadline_floor_s: float = 10.0
    deadline_slack: float = 4.0
    bandwidth_bytes_per_s: float = 12.5e6
    quorum: float = 0.5
    aggregation: Aggregation = "mean"
    trim_fraction: float = 0.2
    clip_iters: int = 3
    max_norm: float | None = None
    max_norm_ratio: float = 10.0
    backend: Backend = "geotrain"
    group: str = "stage0"

    def __post_init__(self) -> None:
        if type(self.every) is not int or self.every < 1:
            raise ConfigError(f"sync.every must be an integer >= 1 (inner steps per round); got {self.every!r}")
        if not (math.isfinite(self.outer_lr) and self.outer_lr > 0):
            raise ConfigError(f"sync.outer_lr must be > 0 (DiLoCo uses 0.7); got {self.outer_lr!r}")
        if not 0.0 <= self.outer_momentum < 1.0:
            raise ConfigError(f"sync.outer_momentum must be in [0, 1) (DiLoCo uses 0.9); got {self.outer_momentum!r}")
        if self.nesterov and self.outer_momentum == 0.0:
            raise ConfigError("sync.nesterov needs sync.outer_momentum > 0; set nesterov = false for plain SGD")
        for name in ("intra_codec", "cross_codec"):
            self._check_codec(name)
        if type(self.fragments) is not int or self.fragments < 1:
            raise ConfigError(f"sync.fragments must be an integer >= 1; got {self.fragments!r}")
        if self.fragments > self.every:
            raise ConfigError(
                f"sync.fragments ({self.fragments}) must be <= sync.every ({self.every}) so each fragment "
                "gets its own inner step to start on"
            )
        if type(self.overlap) is not int or not 0 <= self.overlap < self.every:
            raise ConfigError(f"sync.overlap must be an integer in [0, every) ; got {self.overlap!r}")
        check_mixing(self.mixing)
        if self.deadline_floor_s <= 0 or self.deadline_slack < 1.0 or self.bandwidth_bytes_per_s <= 0:
            raise ConfigError("sync.deadline_floor_s and sync.bandwidth_bytes_per_s must be > 0, deadline_slack >= 1")
        if not 0.0 < self.quorum <= 1.0:
            raise ConfigError(f"sync.quorum must be a fraction in (0, 1]; got {self.quorum!r}")
        if self.aggregation not in ("mean", "trimmed_mean", "centered_clip"):
            raise ConfigError(
                f"sync.aggregation must be 'mean', 'trimmed_mean' or 'centered_clip'; got {self.aggregation!r}"
            )
        if not 0.0 <= self.trim_fraction < 0.5:
            raise ConfigError(f"sync.trim_fraction must be in [0, 0.5); got {self.trim_fraction!r}")
        if type(self.clip_iters) is not int or self.clip_iters < 1:
            raise ConfigError(f"sync.clip_iters must be an integer >= 1; got {self.clip_iters!r}")
        if self.max_norm is not None and not self.max_norm > 0:
            raise ConfigError(f"sync.max_norm must be > 0 or None; got {self.max_norm!r}")
        if not self.max_norm_ratio > 1.0:
            raise ConfigError(f"sync.max_norm_ratio must be > 1; got {self.max_norm_ratio!r}")
        if self.backend not in ("geotrain", "hivemind"):
            raise ConfigError(f"sync.backend must be 'geotrain' or 'hivemind'; got {self.backend!r}")
        if not self.group or len(self.group) > 64:
            raise ConfigError(f"sync.group must be a non-empty name of at most 64 chars; got {self.group!r}")

    def _check_codec(self, name: str) -> None:
        from geotrain.compression import get_codec  # no import cycle at module load

        spec = getattr(self, name)
        try:
            get_codec(spec)
        except ValueError as e:
            raise ConfigError(f"sync.{name} = {spec!r} is not a codec spec: {e}") from None

    def deadline_s(self, payload_bytes: int, bandwidth_bytes_per_s: float | None = None) -> float:
        """Seconds a round may take for ``payload_bytes`` over the slowest hop."""
        bw = self.bandwidth_bytes_per_s if bandwidth_bytes_per_s is None else bandwidth_bytes_per_s
        return max(self.deadline_floor_s, self.deadline_slack * payload_bytes / bw)

    def fragment_offset(self, fragment: int) -> int:
        """The inner step (mod ``every``) at which ``fragment`` starts its rounds: staggered evenly."""
        return (fragment * self.every) // self.fragments
