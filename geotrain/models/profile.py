"""Per-block cost profile measured from the model itself, for the planner.

For each block: training FLOPs per token (forward + backward, counted by
``torch.utils.flop_counter`` on a real forward/backward, run on the meta device
so even the 1B preset costs no memory), parameter bytes, and the bytes per
token of the block's output (what crosses a hop when a stage ends after this
block, before any codec; 0 for the last block). The head's parameter bytes
include its projection even when tied, since a cut keeps a copy on each side.
An embedding lookup counts 0 FLOPs here (the counter sees no matmul).
A Hugging Face model (:class:`~geotrain.models.hf.HFModel`) is profiled the
same way; build it with ``device="meta"`` so a big config allocates no weights.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from geotrain.errors import ConfigError
from geotrain.models.blocks import BlockModel, GPTModel
from geotrain.models.gpt import GPTConfig, build_gpt_block
from geotrain.models.hf import HFModel
from geotrain.planner.profile import LayerProfile

__all__ = ["layer_profile"]


def _meta_block(model: BlockModel, index: int, seed: int) -> nn.Module:
    if isinstance(model, GPTModel):
        return build_gpt_block(model.config, index, seed, device="meta")
    if isinstance(model, HFModel):
        # build_block already copies; a model built with device="meta" holds no real weights at all
        return model.build_block(index, model.seed if model.seed is not None else seed).to("meta")
    # a user block: a meta copy keeps the real weights untouched
    return copy.deepcopy(model.build_block(index, seed)).to("meta")


def layer_profile(
    model: GPTConfig | BlockModel, *, sample_input: torch.Tensor | None = None, seed: int = 0
) -> list[LayerProfile]:
    """One :class:`LayerProfile` per block, in block order.

    ``sample_input`` is the first block's input for one sequence, ``(1, T)``
    token ids; it defaults to a full-length sequence for the GPT. Tokens per
    sample are ``sample_input.shape[0] * sample_input.shape[1]``.
    """
    if isinstance(model, GPTConfig):
        model = GPTModel(model)
    if sample_input is None and isinstance(model, HFModel):
        sample_input = torch.zeros(1, model.seq_len, dtype=torch.long)
    if sample_input is None:
        if not isinstance(model, GPTModel):
            raise ConfigError("layer_profile of a user model needs sample_input: one (1, T) batch of its first input")
        sample_input = torch.zeros(1, model.config.seq_len, dtype=torch.long)
    if sample_input.dim() < 2:
        raise ConfigError(f"sample_input must be at least (B, T); got shape {tuple(sample_input.shape)}")
    tokens = int(sample_input.shape[0] * sample_input.shape[1])
    x = sample_input.to("meta")
    profiles: list[LayerProfile] = []
    for i in range(model.num_blocks):
        block = _meta_block(model, i, seed)
        if x.is_floating_point():
            x = x.detach().requires_grad_(True)
        with FlopCounterMode(display=False) as counter:
            y = block(x)
            if y.requires_grad:
                y.float().sum().backward()
        param_bytes = sum(p.numel() * p.element_size() for p in block.parameters())
        profiles.append(
            LayerProfile(
                flops_per_token=counter.get_total_flops() / tokens,
                param_bytes=int(param_bytes),
                # the last block's output (logits) goes to the loss, never over a hop
                activation_bytes_per_token=0 if i == model.num_blocks - 1 else int(y.numel() * y.element_size() // tokens),
            )
        )
        x = y.detach()
    return profiles
