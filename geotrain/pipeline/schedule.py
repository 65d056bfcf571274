"""Microbatch schedules: the order in which one stage runs forwards and backwards in an inner step.

What is a *schedule*? For a stage ``s`` of ``S`` stages and ``M`` microbatches,
a list of ops ``("F", i)`` / ``("B", i)``. Stages run their lists
independently; messages between neighbours make them line up.

- **GPipe**: all ``M`` forwards, then all ``M`` backwards. Every microbatch is in
  flight at once (activation memory grows with ``M``).
- **1F1B**: ``w = min(S - s - 1, M, max_in_flight - 1)`` warm-up forwards, then
  alternate one forward and one backward, then drain the remaining backwards.
  At most ``w + 1`` microbatches are in flight. Deadlock freedom needs ``w``
  non-increasing along the pipeline, which this formula guarantees for any cap.

Backwards run in microbatch order in both schedules, so every stage
accumulates gradients in the same order as a single process would.
"""

from __future__ import annotations

from typing import Literal

from geotrain.errors import ConfigError

__all__ = ["Op", "make_schedule", "warmup_forwards", "max_in_flight_of"]

Op = tuple[Literal["F", "B"], int]


def warmup_forwards(kind: str, *, stage: int, num_stages: int, microbatches: int, max_in_flight: int | None) -> int:
    """Forwards a stage runs before its first backward."""
    if kind == "gpipe":
        return microbatches
    w = min(num_stages - stage - 1, microbatches)
    if max_in_flight is not None:
        w = min(w, max_in_flight - 1)
    return w


def make_schedule(
    kind: str, *, stage: int, num_stages: int, microbatches: int, max_in_flight: int | None = None
) -> list[Op]:
    """The op list of ``stage`` (see the module docstring)."""
    if kind not in ("1f1b", "gpipe"):
        raise ConfigError(f"pipeline.schedule must be '1f1b' or 'gpipe'; got {kind!r}")
    if not 0 <= stage < num_stages:
        raise ConfigError(f"stage {stage} out of range for {num_stages} stages")
    if microbatches < 1:
        raise ConfigError(f"pipeline.microbatches must be >= 1; got {microbatches}")
    if max_in_flight is not None and max_in_flight < 1:
        raise ConfigError(f"pipeline.max_in_flight must be >= 1 (or unset); got {max_in_flight}")
    w = warmup_forwards(kind, stage=stage, num_stages=num_stages, microbatches=microbatches, max_in_flight=max_in_flight)
    ops: list[Op] = [("F", i) for i in range(w)]
    for i in range(microbatches - w):
        ops.append(("F", w + i))
        ops.append(("B", i))
    ops.extend(("B", i) for i in range(microbatches - w, microbatches))
    return ops


def max_in_flight_of(ops: list[Op]) -> int:
    """Most microbatches forwarded but not yet backwarded at any point of ``ops``."""
    live = peak = 0
    for op, _ in ops:
        live += 1 if op == "F" else -1
        peak = max(peak, live)
    return peak
