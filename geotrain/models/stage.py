"""Cutting a block model into stages.

What is a *stage module*? The blocks ``[start, end)`` of a block model that one
peer runs, as one ``nn.Module``. Its parameter names carry the *global* block
index (``blocks.3.qkv.weight``), so the same parameter has the same name in
every cut of the model: stage groups, checkpoints and the exactness tests
compare by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from geotrain.errors import ConfigError
from geotrain.models.blocks import BlockModel, GPTModel, TiedGroup
from geotrain.models.gpt import GPTConfig

__all__ = ["StageModule", "build_stage", "even_split", "TiedParameter"]


@dataclass(frozen=True)
class TiedParameter:
    """This stage's copy of a weight tied to a copy in another stage; its gradient must be summed with theirs."""

    group: str
    name: str  # name in the stage module, e.g. "blocks.0.wte.weight"
    param: nn.Parameter
    other_blocks: tuple[int, ...]  # blocks outside this stage that hold the other copies


def _get_param(module: nn.Module, dotted: str) -> nn.Parameter:
    owner_path, _, attr = dotted.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    param = getattr(owner, attr)
    assert isinstance(param, nn.Parameter), dotted
    return param


def _set_param(module: nn.Module, dotted: str, param: nn.Parameter) -> None:
    owner_path, _, attr = dotted.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    setattr(owner, attr, param)


class StageModule(nn.Module):
    """Blocks ``[start, end)`` of a block model (see the module docstring).

    ``forward`` takes what block ``start`` takes (token ids ``(B, T)`` on the
    first stage, activations ``(B, T, C)`` elsewhere) and returns block
    ``end - 1``'s output (logits ``(B, T, V)`` on the last stage).
    """

    def __init__(self, model: BlockModel, blocks: dict[int, nn.Module], *, start: int, end: int) -> None:
        super().__init__()
        self.model = model
        self.start, self.end, self.num_blocks = start, end, model.num_blocks
        self.blocks = nn.ModuleDict({str(i): blocks[i] for i in range(start, end)})
        self._tied: list[TiedParameter] = []
        for group in model.tied_groups:
            self._tie(group)

    def _tie(self, group: TiedGroup) -> None:
        inside = [(b, n) for b, n in group.members if self.start <= b < self.end]
        outside = tuple(b for b, _ in group.members if not self.start <= b < self.end)
        if not inside:
            return
        first_block, first_name = inside[0]
        shared = _get_param(self.blocks[str(first_block)], first_name)
        # Members within this stage become one Parameter (their copies are equal by construction).
        for b, n in inside[1:]:
            _set_param(self.blocks[str(b)], n, shared)
        if outside:
            self._tied.append(
                TiedParameter(group=group.name, name=f"blocks.{first_block}.{first_name}", param=shared, other_blocks=outside)
            )

    @property
    def layers(self) -> tuple[int, int]:
        return (self.start, self.end)

    @property
    def is_first(self) -> bool:
        return self.start == 0

    @property
    def is_last(self) -> bool:
        return self.end == self.num_blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = block(x)
        return x

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The model's loss on the last stage's output (mean over tokens)."""
        if not self.is_last:
            raise ConfigError(f"loss() is only defined on the last stage; this stage holds blocks {self.layers}")
        return self.model.loss(output, targets)

    def tied_parameters(self) -> list[TiedParameter]:
        """Weights tied to a copy in another stage. Sum their gradients across stages before each step."""
        return list(self._tied)


def build_stage(model: BlockModel | GPTConfig, layers: tuple[int, int], seed: int) -> StageModule:
    """Build only the blocks ``layers = (start, end)`` of ``model``, initialised from ``seed``.

    Every peer that calls this with the same arguments gets identical weights;
    ``build_stage(m, (0, m.num_blocks), seed)`` is the whole model, equal to
    the concatenation of any cut of it.
    """
    if isinstance(model, GPTConfig):
        model = GPTModel(model)
    start, end = layers
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= model.num_blocks):
        raise ConfigError(
            f"stage layers must satisfy 0 <= start < end <= {model.num_blocks} (the model's block count); got {layers}"
        )
    blocks = {i: model.build_block(i, seed) for i in range(start, end)}
    return StageModule(model, blocks, start=start, end=end)


def even_split(num_blocks: int, num_stages: int) -> list[tuple[int, int]]:
    """Contiguous layer ranges of near-equal block counts (earlier stages get the remainder)."""
    if not 1 <= num_stages <= num_blocks:
        raise ConfigError(f"num_stages must be in [1, {num_blocks}] (one block per stage at least); got {num_stages}")
    base, extra = divmod(num_blocks, num_stages)
    ranges, start = [], 0
    for s in range(num_stages):
        end = start + base + (1 if s < extra else 0)
        ranges.append((start, end))
        start = end
    return ranges
