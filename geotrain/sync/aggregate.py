"""Checking and combining pseudo-gradients: pure tensor math, no I/O.

What is a *contribution*? One or more members' pseudo-gradients for one
fragment (or one shard of it), as ``(value, weight, members)``: a single
member's vector with weight 1, or a region's *sum* with weight = its member
count. The mean of contributions is ``sum(values) / sum(weights)``.

Robust aggregation needs every member's own vector, so with "trimmed_mean" or
"centered_clip" region leaders forward individual vectors instead of sums.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from geotrain.errors import BadContributionError
from geotrain.sync.config import DiLoCoConfig

__all__ = ["Contribution", "check_contribution", "screen", "aggregate"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Contribution:
    """``value`` is a sum over ``members`` (1-D fp32); ``weight`` = len(members) for plain sums."""

    value: torch.Tensor  # (N,) fp32
    members: tuple[str, ...]

    @property
    def weight(self) -> int:
        return len(self.members)


def check_contribution(value: torch.Tensor, *, sender: str, config: DiLoCoConfig) -> float:
    """Return the L2 norm of ``value``; raise BadContributionError naming ``sender`` if unusable."""
    if not bool(torch.isfinite(value).all()):
        raise BadContributionError(f"pseudo-gradient from {sender} holds NaN/Inf; excluded", sender=sender)
    norm = float(torch.linalg.vector_norm(value.double()))
    if config.max_norm is not None and norm > config.max_norm:
        raise BadContributionError(
            f"pseudo-gradient from {sender} has norm {norm:.4g} > sync.max_norm {config.max_norm:.4g}; excluded",
            sender=sender,
        )
    return norm


def screen(
    values: dict[str, torch.Tensor], *, config: DiLoCoConfig
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Split single-member pseudo-gradients into (accepted, {sender: reason}) and log each exclusion.

    Beyond the absolute checks, a vector whose norm exceeds ``max_norm_ratio`` times
    the median norm is excluded when at least 3 are seen together (with fewer, a
    median says nothing about which one is absurd).
    """
    accepted: dict[str, torch.Tensor] = {}
    norms: dict[str, float] = {}
    excluded: dict[str, str] = {}
    for sender in sorted(values):
        try:
            norms[sender] = check_contribution(values[sender], sender=sender, config=config)
            accepted[sender] = values[sender]
        except BadContributionError as e:
            excluded[sender] = str(e)
    if len(norms) >= 3:
        ordered = sorted(norms.values())
        median = ordered[len(ordered) // 2]
        for sender, norm in norms.items():
            if median > 0 and norm > config.max_norm_ratio * median:
                excluded[sender] = (
                    f"pseudo-gradient from {sender} has norm {norm:.4g}, over {config.max_norm_ratio:g}x "
                    f"the median {median:.4g}; excluded"
                )
                del accepted[sender]
    for reason in excluded.values():
        logger.warning("%s", reason)
    return accepted, excluded


def aggregate(contributions: Sequence[Contribution], *, config: DiLoCoConfig) -> torch.Tensor:
    """The group's pseudo-gradient from the counted contributions, ``(N,)`` fp32.

    Contributions are combined in the order given; callers pass them sorted so
    the floating-point sum is the same wherever it is computed.
    """
    if not contributions:
        raise ValueError("aggregate needs at least one contribution")
    if config.aggregation == "mean":
        total = torch.zeros_like(contributions[0].value, dtype=torch.float64)
        for c in contributions:
            total += c.value.double()
        return (total / sum(c.weight for c in contributions)).float()
    singles = [c for c in contributions if c.weight == 1]
    if len(singles) != len(contributions):
        raise ValueError(f"{config.aggregation} needs one vector per member; got region sums")
    stacked = torch.stack([c.value.float() for c in singles])  # (M, N)
    if config.aggregation == "trimmed_mean":
        return trimmed_mean(stacked, config.trim_fraction)
    return centered_clip(stacked, iters=config.clip_iters)


def trimmed_mean(stacked: torch.Tensor, fraction: float) -> torch.Tensor:
    """Per coordinate, drop the ``fraction`` largest and smallest values, average the rest. ``(M, N) -> (N,)``."""
    m = stacked.shape[0]
    k = min(int(math.floor(fraction * m)), (m - 1) // 2)
    if k == 0:
        return stacked.double().mean(0).float()
    ordered = torch.sort(stacked, dim=0).values
    return ordered[k : m - k].double().mean(0).float()


def centered_clip(stacked: torch.Tensor, *, iters: int) -> torch.Tensor:
    """Centered clipping: ``v += mean_i clip(x_i - v, radius)``, from the coordinate-wise median. ``(M, N) -> (N,)``.

    The radius is the median distance of the vectors to the median, so one far
    vector moves the result by at most ``radius / M`` per iteration whatever its norm.
    """
    x = stacked.double()
    v = x.median(dim=0).values
    for _ in range(iters):
        diff = x - v  # (M, N)
        dist = torch.linalg.vector_norm(diff, dim=1)  # (M,)
        radius = dist.median()
        if float(radius) == 0.0:
            break
        scale = torch.clamp(radius / dist.clamp_min(1e-30), max=1.0)  # (M,)
        v = v + (diff * scale[:, None]).mean(0)
    return v.float()
