"""From a contender's checkpoints to its JSON line: validation curve, time to target, bytes, USD.

Every contender is judged by the same function: each checkpoint of its global
model is evaluated with :func:`geotrain.coordinator.evaluate.validation_loss`
(the job's fixed validation batches) after the run, giving a curve of
(training wall time, validation loss). The *target* is the loss contender 1
(synchronous data parallel) reaches at the budget; *time to target* is where
the curve first crosses it, interpolated linearly between the two checkpoints
around the crossing (None if the curve never reaches it). Contenders other
than DP train past the budget until a checkpoint reaches the target (or a cap),
so their curves cover more than the budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from geotrain.config import JobSpec


def checkpoint_loss(job: JobSpec, c: Mapping[str, Any], cache: dict[str, float] | None = None) -> float:
    """Validation loss of one checkpoint (``params``, or a snapshot ``path``), remembered in ``cache``."""
    from geotrain.coordinator.evaluate import validation_loss

    key = str(c["path"]) if c.get("path") else f"{c['tokens']}@{float(c['t_s']):.6f}"
    if cache is not None and key in cache:
        return cache[key]
    params = c.get("params")
    if params is None:
        params = torch.load(Path(c["path"]), weights_only=True, map_location="cpu")
    loss = float(validation_loss(job, params))
    if cache is not None:
        cache[key] = loss
    return loss


def evaluate_checkpoints(job: JobSpec, checkpoints: Sequence[dict[str, Any]], init_loss: float,
                         cache: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """``[{t_s, tokens, loss}]`` sorted by time, starting with the seeded model at t = 0."""
    curve = [{"t_s": 0.0, "tokens": 0, "loss": init_loss}]
    for c in checkpoints:
        curve.append({"t_s": float(c["t_s"]), "tokens": int(c["tokens"]), "loss": checkpoint_loss(job, c, cache)})
    curve.sort(key=lambda r: r["t_s"])
    return curve


def time_to_target(curve: Sequence[Mapping[str, Any]], target: float | None) -> float | None:
    """First time the curve reaches ``target`` (linear between checkpoints), or None."""
    if target is None:
        return None
    for i, r in enumerate(curve):
        if r["loss"] <= target:
            if i == 0:
                return float(r["t_s"])
            a = curve[i - 1]
            span = a["loss"] - r["loss"]
            frac = 1.0 if span <= 0 else (a["loss"] - target) / span
            return float(a["t_s"] + frac * (r["t_s"] - a["t_s"]))
    return None


def usd(
    *, wall_s: float, peer_regions: Sequence[str], prices: Mapping[str, float],
    cross_pairs: Mapping[str, float] | None, egress: Mapping[str, float],
) -> dict[str, float | None]:
    """Peers' hourly prices x wall time, plus each region's egress price x the bytes it sent to other regions."""
    compute = sum(prices.get(r, 0.0) for r in peer_regions) * wall_s / 3600
    if cross_pairs is None:
        return {"compute": compute, "egress": None, "total": compute}
    out = sum(n / 1e9 * egress.get(k.split("->")[0], 0.0) for k, n in cross_pairs.items())
    return {"compute": compute, "egress": out, "total": compute + out}


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b`` when both are known and ``b`` > 0."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or b <= 0:
        return None
    return a / b


def rounded(x: Any, digits: int = 4) -> Any:
    if isinstance(x, float):
        return round(x, digits) if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [rounded(v, digits) for v in x]
    return x
