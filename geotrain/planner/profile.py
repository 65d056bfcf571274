"""Per-layer cost profile of a model, the planner's view of it.

A *layer* here is one entry of the model's ordered block list: layer 0 is the
embedding, layers ``1..L`` are transformer blocks, layer ``L + 1`` is the final
norm plus the language-model head. Stages own contiguous, half-open ranges of
these indices, ``[start, end)``.

For each layer the planner needs three numbers:

- ``flops_per_token``: training FLOPs (forward + backward) per token;
- ``param_bytes``: bytes of the layer's parameters in the training dtype;
- ``activation_bytes_per_token``: bytes per token of the tensor that leaves
  this layer for the next one (what crosses a pipeline hop when a stage ends
  here), before any codec. The head emits nothing to another stage: 0.

:func:`transformer_profile` derives them analytically for a GPT-style decoder;
``geotrain.models`` produces the same list from a real torch model.

Derivation (``h`` hidden, ``T`` sequence length, ``V`` vocabulary, ``d`` bytes
per element; training = 3 x forward, the usual fwd:bwd = 1:2 rule):

- block parameters: ``12 h^2`` weights (QKV + out = ``4 h^2``, MLP ``8 h^2``)
  plus ``13 h`` biases and norm parameters;
- block forward FLOPs per token: ``2 * 12 h^2`` for the matmuls plus ``4 T h``
  for attention scores and the weighted sum (full-sequence attention, as in
  Kaplan et al.'s count), so training FLOPs per token are
  ``72 h^2 + 12 T h``;
- embedding: ``V h + T h`` parameters (token and learned position tables),
  about ``3 h`` FLOPs per token (lookup, add, scatter-add in backward);
- head: final norm ``2 h`` plus an untied ``V h`` projection (a stage split
  keeps its own copy even when tied), ``6 V h`` training FLOPs per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from geotrain.errors import ConfigError


@dataclass(frozen=True)
class LayerProfile:
    """Cost figures of one layer (see the module docstring for the units)."""

    flops_per_token: float
    param_bytes: int
    activation_bytes_per_token: int

    def __post_init__(self) -> None:
        if not self.flops_per_token >= 0:
            raise ConfigError(f"flops_per_token must be >= 0; got {self.flops_per_token}")
        if self.param_bytes < 0:
            raise ConfigError(f"param_bytes must be >= 0; got {self.param_bytes}")
        if self.activation_bytes_per_token < 0:
            raise ConfigError(
                f"activation_bytes_per_token must be >= 0; got {self.activation_bytes_per_token}"
            )


def transformer_profile(
    *, layers: int, hidden: int, seq_len: int, vocab: int, dtype_bytes: int
) -> list[LayerProfile]:
    """Profile of a GPT-style decoder: ``[embedding, block x layers, norm + head]``.

    ``len(result) == layers + 2``. See the module docstring for the formulas.
    """
    for name, value in (("layers", layers), ("hidden", hidden), ("seq_len", seq_len), ("vocab", vocab)):
        if value <= 0:
            raise ConfigError(f"model.{name} must be a positive integer; got {value}")
    if dtype_bytes not in (1, 2, 4, 8):
        raise ConfigError(f"model.dtype_bytes must be 1, 2, 4 or 8; got {dtype_bytes}")
    h, t, v, d = hidden, seq_len, vocab, dtype_bytes
    act = h * d  # (B, T, h) leaves every layer but the head
    embedding = LayerProfile(flops_per_token=3.0 * h, param_bytes=(v * h + t * h) * d, activation_bytes_per_token=act)
    block = LayerProfile(
        flops_per_token=72.0 * h * h + 12.0 * t * h,
        param_bytes=(12 * h * h + 13 * h) * d,
        activation_bytes_per_token=act,
    )
    head = LayerProfile(flops_per_token=6.0 * v * h, param_bytes=(v * h + 2 * h) * d, activation_bytes_per_token=0)
    return [embedding, *([block] * layers), head]
