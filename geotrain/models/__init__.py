"""Models as ordered lists of blocks, and how they are cut into pipeline stages.

- :class:`GPTConfig`, :data:`PRESETS`: the reference decoder-only GPT (byte-level, 256 tokens).
- :class:`BlockModel`, :class:`GPTModel`, :class:`BlockList`, :class:`TiedGroup`: the block-list form.
- :func:`build_stage` -> :class:`StageModule`: blocks ``[start, end)`` built deterministically from a seed.
- :func:`load_block_model` / :func:`resolve_model`: user models given as ``module:function``.
- :class:`HFModel`, :func:`weights_digest`: local Hugging Face causal LMs as block models (``geotrain.models.hf``).
- :func:`geotrain.models.profile.layer_profile`: per-block FLOPs/bytes for the planner.

This package imports no networking.
"""

from geotrain.models.blocks import BlockList, BlockModel, GPTModel, TiedGroup, cross_entropy_loss
from geotrain.models.gpt import PRESETS, GPTConfig
from geotrain.models.hf import HFModel, weights_digest
from geotrain.models.loader import load_block_model, resolve_model
from geotrain.models.stage import StageModule, TiedParameter, build_stage, even_split

__all__ = [
    "PRESETS",
    "BlockList",
    "BlockModel",
    "GPTConfig",
    "GPTModel",
    "HFModel",
    "StageModule",
    "TiedGroup",
    "TiedParameter",
    "build_stage",
    "cross_entropy_loss",
    "even_split",
    "load_block_model",
    "resolve_model",
    "weights_digest",
]
