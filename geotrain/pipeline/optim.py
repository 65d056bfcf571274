"""The inner optimizer: AdamW, with torch's fused kernel where the parameters' device has one.

The fused kernel updates every parameter in one pass per state tensor instead of a loop of
elementwise ops: on one CPU core it stepped the tiny GPT (90k parameters) in 0.35 ms against 1.7 ms,
and the small one (1.2M) in 1.2 ms against 4.5 ms. torch has one for CUDA and, from 2.4, for the CPU; where
it has none (an older torch, another device, parameters on several devices) the default AdamW is used.
The two compute the same update up to the order of float operations.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["inner_adamw", "is_fused"]

FUSED_DEVICES = frozenset({"cpu", "cuda"})


def inner_adamw(
    params: Iterable[torch.nn.Parameter],
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    weight_decay: float = 0.01,
) -> torch.optim.AdamW:
    """AdamW over ``params``, fused where torch supports it for their device (see the module docstring)."""
    params = list(params)
    devices = {p.device.type for p in params}
    if len(devices) == 1 and devices <= FUSED_DEVICES and all(p.is_floating_point() for p in params):
        try:
            return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=True)
        except (RuntimeError, TypeError, ValueError):  # this torch has no fused kernel for the device
            pass
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay)


def is_fused(optimizer: torch.optim.Optimizer) -> bool:
    """True when ``optimizer`` runs torch's fused kernel (its step counts then live on the parameters' device)."""
    return bool(optimizer.defaults.get("fused"))
