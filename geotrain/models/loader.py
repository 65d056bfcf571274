"""Loading a user model given as ``module:function``.

The function is called with keyword arguments from the job file and returns
either an ``nn.Sequential`` (its first module takes the raw input, its last
produces the loss input; loss = token cross-entropy), a list of modules, or a
:class:`~geotrain.models.blocks.BlockList` that also declares a loss and tied
groups. It runs with the global torch RNG seeded from ``seed`` (and restored
afterwards), so every peer that loads the same spec with the same seed builds
identical weights. Unlike the reference GPT, a user model is built whole on
every peer and then sliced.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import torch
from torch import nn

from geotrain.errors import ConfigError
from geotrain.models.blocks import BlockList, BlockModel, GPTModel
from geotrain.models.gpt import GPTConfig

__all__ = ["load_block_model", "resolve_model"]

_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def load_block_model(spec: str, *, seed: int, kwargs: dict[str, Any] | None = None) -> BlockModel:
    """Import ``module:function``, call it under a seeded RNG, and wrap the result as a block model."""
    if not _SPEC.match(spec):
        raise ConfigError(f"model loader must look like 'package.module:function'; got {spec!r}")
    module_name, func_name = spec.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"cannot import model module {module_name!r} ({e}); is it on PYTHONPATH?") from e
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ConfigError(f"{module_name!r} has no callable {func_name!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        result = func(**(kwargs or {}))
    if isinstance(result, BlockList):
        if result.seed != seed:
            raise ConfigError(f"{spec} returned a BlockList with seed={result.seed}; set it to the seed passed ({seed})")
        return result
    if isinstance(result, nn.Sequential):
        return BlockList(blocks=list(result), seed=seed)
    if isinstance(result, (list, tuple)):
        return BlockList(blocks=list(result), seed=seed)
    raise ConfigError(
        f"{spec} returned {type(result).__name__}; return an nn.Sequential, a list of nn.Module, "
        "or geotrain.models.BlockList"
    )


def resolve_model(model: str | GPTConfig | BlockModel, *, seed: int = 0) -> BlockModel:
    """A block model from a preset name (``"tiny"``), a ``module:function`` spec, a GPT config or itself."""
    if isinstance(model, BlockModel):
        return model
    if isinstance(model, GPTConfig):
        return GPTModel(model)
    if ":" in model:
        return load_block_model(model, seed=seed)
    return GPTModel(GPTConfig.preset(model))
