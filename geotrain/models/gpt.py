"""The reference model: a decoder-only GPT expressed as an ordered list of blocks.

What is a *block*? The unit a plan cuts at. A stage holds a contiguous range
``[start, end)`` of blocks. For the GPT of ``n_layer`` transformer layers there
are ``n_layer + 2`` blocks:

- block 0: token + position embedding, ``(B, T) int64 -> (B, T, C)``
- blocks 1..n_layer: pre-norm transformer layers, ``(B, T, C) -> (B, T, C)``
- block n_layer + 1: final norm + linear head, ``(B, T, C) -> (B, T, V)`` logits

Every block is initialised from its own generator seeded by ``(seed, block
index)``, so a peer builds only the blocks of its stage and still gets the same
weights as every other peer of that stage (and as a single-process model built
from the same seed). With tied embeddings the head's weight is initialised from
the embedding block's generator, so both copies start identical even when they
live in different stages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from geotrain.errors import ConfigError

__all__ = ["GPTConfig", "PRESETS", "Embedding", "TransformerBlock", "Head", "build_gpt_block", "block_generator"]


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Shape of the reference GPT. ``vocab_size`` 256 is the byte-level tokenizer's vocabulary."""

    vocab_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 64
    seq_len: int = 64
    mlp_ratio: int = 4
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "seq_len", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"model.{name} must be a positive integer; got {value!r}")
        if self.d_model % self.n_head:
            raise ConfigError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_head ({self.n_head}); "
                "pick n_head among the divisors of d_model"
            )

    @property
    def num_blocks(self) -> int:
        """Embedding + ``n_layer`` transformer layers + head."""
        return self.n_layer + 2

    @classmethod
    def preset(cls, name: str, **overrides: object) -> GPTConfig:
        """A named size (see :data:`PRESETS`), optionally with some fields replaced."""
        try:
            base = PRESETS[name]
        except KeyError:
            raise ConfigError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}") from None
        return replace(base, **overrides) if overrides else base  # type: ignore[arg-type]

    def num_parameters(self) -> int:
        """Distinct trainable parameters (a tied head weight counted once)."""
        c, v, t, h = self.d_model, self.vocab_size, self.seq_len, self.mlp_ratio * self.d_model
        per_layer = 2 * 2 * c + (c * 3 * c + 3 * c) + (c * c + c) + (c * h + h) + (h * c + c)
        head = 2 * c + (0 if self.tie_embeddings else c * v)
        return v * c + t * c + self.n_layer * per_layer + head


# "tiny" is for tests (~0.1M parameters), "small" for the demo on 2 CPU cores,
# the larger ones only for planning (their profile is computed on the meta device).
PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(n_layer=4, n_head=4, d_model=40, seq_len=32),
    "small": GPTConfig(n_layer=6, n_head=4, d_model=128, seq_len=128),
    "medium": GPTConfig(n_layer=8, n_head=8, d_model=512, seq_len=256),
    "125m": GPTConfig(n_layer=12, n_head=12, d_model=768, seq_len=1024),
    "350m": GPTConfig(n_layer=24, n_head=16, d_model=1024, seq_len=1024),
    "1b": GPTConfig(n_layer=24, n_head=16, d_model=2048, seq_len=2048),
}


def block_generator(seed: int, index: int) -> torch.Generator:
    """A CPU generator for block ``index``, independent of every other block's stream."""
    # SeedSequence mixes (seed, index) well and is identical on every platform.
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, int(index)]).generate_state(2, np.uint32)
    g = torch.Generator(device="cpu")
    g.manual_seed(int(state[0]) << 32 | int(state[1]))
    return g


class Embedding(nn.Module):
    """Block 0: token + learned position embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.seq_len, config.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        _, t = idx.shape  # (B, T)
        pos = torch.arange(t, device=idx.device)
        return self.wte(idx) + self.wpe(pos)  # (B, T, C)


class TransformerBlock(nn.Module):
    """Pre-norm layer: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        c = config.d_model
        self.n_head = config.n_head
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, config.mlp_ratio * c)
        self.out = nn.Linear(config.mlp_ratio * c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape  # (B, T, C)
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        # (B, nh, T, hs)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)  # (B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    """Last block: final LayerNorm + linear projection to vocabulary logits."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))  # (B, T, V)


def _normal_(t: torch.Tensor, std: float, g: torch.Generator) -> None:
    with torch.no_grad():
        t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float32).mul_(std).to(t.dtype))


def _init_linear_and_norms(module: nn.Module, g: torch.Generator, out_std: float, out_names: set[str]) -> None:
    # named_modules order is registration order, identical on every peer.
    for name, sub in module.named_modules():
        if isinstance(sub, nn.Linear):
            _normal_(sub.weight, out_std if name in out_names else 0.02, g)
            if sub.bias is not None:
                nn.init.zeros_(sub.bias)
        elif isinstance(sub, nn.LayerNorm):
            nn.init.ones_(sub.weight)
            nn.init.zeros_(sub.bias)


def _build(config: GPTConfig, index: int) -> nn.Module:
    if index == 0:
        return Embedding(config)
    if index == config.num_blocks - 1:
        return Head(config)
    return TransformerBlock(config)


def build_gpt_block(config: GPTConfig, index: int, seed: int, *, device: str | torch.device = "cpu") -> nn.Module:
    """Build and initialise block ``index`` of the GPT deterministically from ``(seed, index)``.

    On ``device="meta"`` nothing is allocated or initialised (used for profiles of big presets).
    """
    if not 0 <= index < config.num_blocks:
        raise ConfigError(f"block index {index} out of range [0, {config.num_blocks}) for n_layer={config.n_layer}")
    # Build on meta first: no global RNG draw, no wasted default init.
    with torch.device("meta"):
        block = _build(config, index)
    if torch.device(device).type == "meta":
        return block
    block = block.to_empty(device="cpu")
    g = block_generator(seed, index)
    if isinstance(block, Embedding):
        _normal_(block.wte.weight, 0.02, g)  # drawn first: the tied head replays this stream
        _normal_(block.wpe.weight, 0.02, g)
    elif isinstance(block, TransformerBlock):
        # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer) keep the residual stream's variance flat.
        _init_linear_and_norms(block, g, 0.02 / math.sqrt(2 * config.n_layer), {"proj", "out"})
    else:
        assert isinstance(block, Head)
        nn.init.ones_(block.ln_f.weight)
        nn.init.zeros_(block.ln_f.bias)
        if config.tie_embeddings:
            _normal_(block.lm_head.weight, 0.02, block_generator(seed, 0))
        else:
            _normal_(block.lm_head.weight, 0.02, g)
    return block.to(device)
