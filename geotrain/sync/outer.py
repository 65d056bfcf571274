"""Fragments of a stage's parameters and the outer optimizer that moves their global copy.

What is the *global* copy? The parameters as of the last committed round,
identical on every member of the stage group; the local (trained) parameters
drift from it for ``every`` inner steps. It is kept as one flat fp32 vector per
fragment, so a round's payload is a single contiguous tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from geotrain.errors import ConfigError
from geotrain.sync.config import DiLoCoConfig

__all__ = ["Fragment", "split_fragments", "OuterState", "commit"]


@dataclass
class Fragment:
    """A set of whole parameters synced together; ``numel`` elements when flattened."""

    index: int
    names: tuple[str, ...]
    params: tuple[nn.Parameter, ...]

    @property
    def numel(self) -> int:
        return sum(p.numel() for p in self.params)

    def flat(self) -> torch.Tensor:
        """The local parameters as one fp32 vector ``(numel,)`` on the CPU (a copy).

        The global copy and the outer optimizer live on the CPU whatever device
        trains the stage: they are touched once a round, and accelerator memory
        is better spent on the inner steps (as DiLoCo implementations do).
        """
        return torch.cat([p.detach().reshape(-1).float().cpu() for p in self.params])

    def assign(self, flat: torch.Tensor) -> None:
        """Overwrite the local parameters from a flat fp32 vector."""
        with torch.no_grad():
            pos = 0
            for p in self.params:
                n = p.numel()
                p.copy_(flat[pos : pos + n].view_as(p).to(p.dtype))
                pos += n


def split_fragments(params: Sequence[tuple[str, nn.Parameter]], count: int) -> list[Fragment]:
    """Cut parameters (in the given order) into ``count`` fragments of about equal size.

    Parameters are never split, so a fragment is a run of consecutive
    parameters; every member cuts the same way from the same parameter list.
    """
    if not params:
        raise ConfigError("a stage group sync needs at least one parameter")
    if count > len(params):
        raise ConfigError(f"sync.fragments ({count}) exceeds the stage's {len(params)} parameters; lower it")
    total = sum(p.numel() for _, p in params)
    fragments: list[Fragment] = []
    start, acc = 0, 0
    for i, (_, p) in enumerate(params):
        acc += p.numel()
        remaining_params = len(params) - (i + 1)
        remaining_frags = count - len(fragments) - 1
        # cut when this fragment reached its share, keeping a parameter for every later fragment
        due = acc >= total * (len(fragments) + 1) / count
        if remaining_frags > 0 and (due or remaining_params == remaining_frags):
            chunk = params[start : i + 1]
            fragments.append(Fragment(len(fragments), tuple(n for n, _ in chunk), tuple(q for _, q in chunk)))
            start = i + 1
    chunk = params[start:]
    fragments.append(Fragment(len(fragments), tuple(n for n, _ in chunk), tuple(q for _, q in chunk)))
    assert len(fragments) == count
    return fragments


class OuterState:
    """The global vector and outer momentum of one fragment; SGD with optional Nesterov.

    Same update as ``torch.optim.SGD(momentum=mu, nesterov=..., dampening=0)``:
    ``buf = mu * buf + g`` (``buf = g`` at the first step), then
    ``global -= lr * (g + mu * buf)`` with Nesterov or ``lr * buf`` without.
    """

    def __init__(self, global_flat: torch.Tensor, config: DiLoCoConfig) -> None:
        self.config = config
        self.global_flat = global_flat.detach().clone().float()  # (N,)
        self.momentum: torch.Tensor | None = None  # (N,) after the first committed round
        self.version = 0  # committed rounds

    def step(self, pseudo_grad: torch.Tensor) -> torch.Tensor:
        """Apply one outer step with the group's pseudo-gradient; return the update applied ``(N,)``."""
        lr, mu = self.config.outer_lr, self.config.outer_momentum
        g = pseudo_grad.float()
        if mu > 0:
            if self.momentum is None:
                self.momentum = g.clone()
            else:
                self.momentum.mul_(mu).add_(g)
            direction = g.add(self.momentum, alpha=mu) if self.config.nesterov else self.momentum
        else:
            direction = g
        update = direction * lr
        self.global_flat.sub_(update)
        self.version += 1
        return update

    def state_dict(self) -> dict[str, torch.Tensor | int]:
        out: dict[str, torch.Tensor | int] = {"global": self.global_flat.clone(), "version": self.version}
        if self.momentum is not None:
            out["momentum"] = self.momentum.clone()
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor | int]) -> None:
        glob = state["global"]
        assert isinstance(glob, torch.Tensor)
        if glob.shape != self.global_flat.shape:
            raise ConfigError(f"state has a fragment of {tuple(glob.shape)}; this stage's is {tuple(self.global_flat.shape)}")
        self.global_flat = glob.detach().clone().float()
        mom = state.get("momentum")
        self.momentum = mom.detach().clone().float() if isinstance(mom, torch.Tensor) else None
        version = state.get("version", 0)
        self.version = int(version) if isinstance(version, int) else int(version.item())


def commit(fragment: Fragment, outer: OuterState, delta: torch.Tensor, *, counted: bool) -> None:
    """The commit point on one member: outer step with the group's pseudo-gradient, then the local weights.

    Counted members take the new global weights (mixed with their current ones by
    ``mixing`` when the round overlapped ``overlap > 0`` inner steps); a member whose
    vector was not counted shifts its weights by the same update, keeping its own progress.
    """
    config = outer.config
    old_global = outer.global_flat.clone()
    outer.step(delta)
    local = fragment.flat()  # (N,)
    if not counted:
        fragment.assign(local + (outer.global_flat - old_global))
    elif config.overlap == 0:
        fragment.assign(outer.global_flat)
    else:
        fragment.assign(local * config.mixing + outer.global_flat * (1.0 - config.mixing))
