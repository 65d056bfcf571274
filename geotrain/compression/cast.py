"""Cast codecs: ``none`` (raw bytes), ``fp16`` and ``bf16`` (one 16-bit float per element).

``fp16`` keeps 11 significant bits but only the range +-65504; ``bf16`` keeps
fp32's range with 8 significant bits. Pick ``bf16`` for values that may be
large (logits, un-normalised activations), ``fp16`` for everything else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from geotrain.compression import kernels
from geotrain.compression.base import (
    Buffer,
    Codec,
    Encoded,
    check_input,
    dtype_name,
    raise_nonfinite,
    read_header,
    register_codec,
    view_buffer,
)
from geotrain.errors import CodecError, ConfigError

__all__ = ["CastCodec", "CastConfig"]

_WIRE = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}
# fp32 values above this round to inf in fp16 (65504 + half an ulp)
_FP16_MAX = 65519.99


@dataclass(frozen=True, kw_only=True)
class CastConfig:
    """Options of a cast codec.

    ``allow_nonfinite``: pass NaN/Inf through instead of raising NonFiniteError
    (only for debugging runs where you want to see where they go).
    """

    wire: str = "none"
    allow_nonfinite: bool = False

    def __post_init__(self) -> None:
        if self.wire not in _WIRE:
            raise ConfigError(f"cast wire must be one of {sorted(_WIRE)}; got {self.wire!r}")
        if not isinstance(self.allow_nonfinite, bool):
            raise ConfigError(f"allow_nonfinite must be true or false; got {self.allow_nonfinite!r}")


class CastCodec(Codec):
    """Send every element as-is (``none``) or cast to a 16-bit float (``fp16``, ``bf16``)."""

    def __init__(self, config: CastConfig) -> None:
        self.config = config
        self.name = config.wire
        self._wire_dtype = _WIRE[config.wire]

    @property
    def spec(self) -> str:
        return f"{self.name}:allow_nonfinite=true" if self.config.allow_nonfinite else self.name

    @property
    def lossless(self) -> bool:
        return self._wire_dtype is None

    def encode(self, x: torch.Tensor) -> Encoded:
        x = check_input(x)
        meta: dict[str, Any] = {"shape": list(x.shape), "dtype": dtype_name(x.dtype)}
        wire = self._wire_dtype
        flat = x.reshape(-1)  # (N,)
        if not self.config.allow_nonfinite and flat.numel():
            # two full reductions, no temporaries: NaN propagates through amax/amin, and the
            # same two numbers tell whether fp16 can hold the values at all
            hi, lo = kernels.minmax_flat(flat)
            if not (math.isfinite(hi) and math.isfinite(lo)):
                raise_nonfinite(self.spec)
            if wire == torch.float16 and max(hi, -lo) > _FP16_MAX:
                raise CodecError(
                    f"codec {self.spec!r}: values beyond the fp16 range (+-65504); use 'bf16' for this tensor"
                )
        if wire is None or wire == x.dtype:
            out = flat
            meta["wire"] = dtype_name(x.dtype)
        else:
            out = torch.empty(flat.numel(), dtype=wire)
            kernels.cast_flat(flat, out)
            meta["wire"] = dtype_name(wire)
        return Encoded(codec=self.spec, meta=meta, buffers=(out,))

    def decode(self, meta: Mapping[str, Any], buffers: Sequence[Buffer]) -> torch.Tensor:
        shape, dtype, numel = read_header(meta, codec=self.name, nbuffers=1, buffers=buffers)
        # "none" keeps the input dtype on the wire; the 16-bit casts always send their own dtype
        expected_wire = dtype if self._wire_dtype is None else self._wire_dtype
        if meta.get("wire") != dtype_name(expected_wire):
            raise CodecError(f"{self.name}: meta['wire'] must be {dtype_name(expected_wire)!r}; got {meta.get('wire')!r}")
        payload = view_buffer(buffers[0], expected_wire, numel, codec=self.name, what="payload")
        # .to() copies when dtypes differ; clone when they match so the result never aliases
        # a (possibly read-only, reused) network buffer
        out = torch.empty(numel, dtype=dtype)
        kernels.cast_flat(payload, out)
        return out.view(shape)

    def estimate_ratio(self, numel: int, dtype: torch.dtype) -> float:
        if self._wire_dtype is None:
            return 1.0
        in_size = torch.empty((), dtype=dtype).element_size()
        return in_size / 2.0


def _factory(wire: str) -> Any:
    def make(*, allow_nonfinite: bool = False) -> CastCodec:
        return CastCodec(CastConfig(wire=wire, allow_nonfinite=allow_nonfinite))

    return make


for _wire in _WIRE:
    register_codec(_wire, _factory(_wire))
