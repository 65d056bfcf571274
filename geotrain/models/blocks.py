"""A model as an ordered list of blocks: the form every model takes before it is cut into stages.

What is a *block model*? Anything that can say how many blocks it has, build
block ``i`` deterministically from a seed, name the parameters that are tied
across blocks, and compute the loss from the last block's output. The
reference GPT (:class:`GPTModel`) builds each block from its own seed; a user
model (:class:`BlockList`, usually from :func:`geotrain.models.loader.load_block_model`)
is built whole and sliced.

What is a *tied group*? Parameters in different blocks that are one weight
mathematically (the GPT's token embedding and output head). When all members
sit in one stage they are one ``nn.Parameter``. When they sit in different
stages each stage holds an identically initialised copy and the pipeline must
sum their gradients before every optimizer step (as Megatron does), so the
copies stay equal.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from geotrain.errors import ConfigError
from geotrain.models.gpt import GPTConfig, build_gpt_block

__all__ = ["TiedGroup", "BlockModel", "GPTModel", "BlockList", "cross_entropy_loss"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy: logits ``(B, T, V)``, targets ``(B, T)`` int64."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


@dataclass(frozen=True, kw_only=True)
class TiedGroup:
    """Parameters that are one weight: ``members`` are ``(block index, parameter name in that block)``."""

    name: str
    members: tuple[tuple[int, str], ...]

    def __post_init__(self) -> None:
        if len(self.members) < 2:
            raise ConfigError(f"tied group {self.name!r} needs at least two members; got {self.members}")
        blocks = [b for b, _ in self.members]
        if len(set(blocks)) != len(blocks):
            raise ConfigError(f"tied group {self.name!r}: members must be in different blocks; got {self.members}")


class BlockModel(abc.ABC):
    """An ordered list of blocks that can be cut into stages (see the module docstring)."""

    @property
    @abc.abstractmethod
    def num_blocks(self) -> int: ...

    @property
    def tied_groups(self) -> tuple[TiedGroup, ...]:
        return ()

    @abc.abstractmethod
    def build_block(self, index: int, seed: int) -> nn.Module:
        """Block ``index`` with deterministic weights: equal on every peer for the same seed."""

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return cross_entropy_loss(output, targets)


class GPTModel(BlockModel):
    """The reference GPT as a block model; each block built from its own ``(seed, index)`` stream."""

    def __init__(self, config: GPTConfig) -> None:
        self.config = config

    @property
    def num_blocks(self) -> int:
        return self.config.num_blocks

    @property
    def tied_groups(self) -> tuple[TiedGroup, ...]:
        if not self.config.tie_embeddings:
            return ()
        return (TiedGroup(name="embedding", members=((0, "wte.weight"), (self.num_blocks - 1, "lm_head.weight"))),)

    def build_block(self, index: int, seed: int) -> nn.Module:
        return build_gpt_block(self.config, index, seed)


@dataclass(kw_only=True)
class BlockList(BlockModel):
    """A user model already built: ``blocks[0]`` takes the raw input, ``blocks[-1]`` produces the loss input.

    ``seed`` records what the loader seeded the global RNG with while building;
    :meth:`build_block` refuses another seed, since the weights are fixed already.
    :meth:`build_block` returns a deep copy, so stages built in one process share
    no parameter (a tie across blocks is re-made by ``build_stage`` where it belongs).
    """

    blocks: Sequence[nn.Module]
    seed: int
    loss_fn: LossFn = cross_entropy_loss
    tied: tuple[TiedGroup, ...] = field(default=())

    def __post_init__(self) -> None:
        if len(self.blocks) < 1:
            raise ConfigError("a user model must have at least one block; return an nn.Sequential or a BlockList")
        for i, b in enumerate(self.blocks):
            if not isinstance(b, nn.Module):
                raise ConfigError(f"block {i} is a {type(b).__name__}, not a torch.nn.Module")
        for group in self.tied:
            for index, name in group.members:
                if not 0 <= index < len(self.blocks):
                    raise ConfigError(f"tied group {group.name!r}: block {index} out of range")
                if name not in dict(self.blocks[index].named_parameters(remove_duplicate=False)):
                    raise ConfigError(f"tied group {group.name!r}: block {index} has no parameter {name!r}")

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def tied_groups(self) -> tuple[TiedGroup, ...]:
        return self.tied

    def build_block(self, index: int, seed: int) -> nn.Module:
        if seed != self.seed:
            raise ConfigError(
                f"this user model was built with seed {self.seed}; load it again with seed={seed} "
                "(its blocks are built once, by the user's function)"
            )
        return copy.deepcopy(self.blocks[index])

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(output, targets)
