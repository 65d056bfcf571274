"""``int8``: blockwise absmax quantization to signed 8-bit codes.

Each block of ``block`` elements is sent as ``round(x / s)`` in [-127, 127]
with ``s = max|x| / 127`` per block. Error bound per element: ``s / 2``, i.e.
``max|x in block| / 254``. Wire: ``numel`` bytes of codes + one scale per block.

Spec options: ``block`` (even, 8..65536, default 256), ``scale`` (``bf16``
default, ``fp16``, ``fp32``; see :mod:`geotrain.compression.blockwise`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from geotrain.compression import blockwise as bw
from geotrain.compression import kernels
from geotrain.compression.base import (
    Buffer,
    Codec,
    Encoded,
    check_input,
    dtype_name,
    meta_int,
    read_header,
    register_codec,
    view_buffer,
)
from geotrain.errors import ConfigError

__all__ = ["Int8Codec", "Int8Config"]

QMAX = 127.0


@dataclass(frozen=True, kw_only=True)
class Int8Config:
    """Options of the ``int8`` codec: elements per block and the dtype of the per-block scales."""

    block: int = 256
    scale: str = "bf16"

    def __post_init__(self) -> None:
        if type(self.block) is not int or not 8 <= self.block <= 65536 or self.block % 2:
            raise ConfigError(f"int8 block must be an even int in [8, 65536] (e.g. 256); got {self.block!r}")
        if self.scale not in bw.SCALE_DTYPES:
            raise ConfigError(f"int8 scale must be one of {sorted(bw.SCALE_DTYPES)}; got {self.scale!r}")


class Int8Codec(Codec):
    """Blockwise absmax int8 quantizer (see module docstring for the error bound)."""

    name = "int8"

    def __init__(self, config: Int8Config) -> None:
        self.config = config

    @property
    def spec(self) -> str:
        return f"int8:block={self.config.block},scale={self.config.scale}"

    def encode(self, x: torch.Tensor) -> Encoded:
        x = check_input(x)
        flat = x.reshape(-1)  # (N,)
        layout = bw.Layout(flat.numel(), self.config.block)
        codes = torch.empty(layout.numel, dtype=torch.int8)  # (N,)
        nf, b = layout.nfull, layout.block
        sent, scales = bw.encode_blocks(
            flat, layout, QMAX, self.config.scale, "int8", codes[: nf * b].view(nf, b), codec=self.spec
        )
        if layout.tail:
            inv = bw.inverse(scales[-1:])
            codes[nf * b :].copy_((flat[nf * b :].float() * inv).round_().clamp_(-QMAX, QMAX))
        meta: dict[str, Any] = {
            "shape": list(x.shape),
            "dtype": dtype_name(x.dtype),
            "block": b,
            "scale": bw.scale_wire_name(sent),
        }
        return Encoded(codec=self.spec, meta=meta, buffers=(codes, sent))

    def decode(self, meta: Mapping[str, Any], buffers: Sequence[Buffer]) -> torch.Tensor:
        shape, dtype, numel = read_header(meta, codec=self.name, nbuffers=2, buffers=buffers)
        b = meta_int(meta, "block", codec=self.name, lo=self.config.block, hi=self.config.block)
        scale_dtype = bw.scale_dtype_of(meta, self.config.scale, codec=self.name)
        layout = bw.Layout(numel, b)
        codes = view_buffer(buffers[0], torch.int8, numel, codec=self.name, what="codes")
        scales = bw.read_scales(
            view_buffer(buffers[1], scale_dtype, layout.nblocks, codec=self.name, what="scales"), codec=self.name
        )
        out = torch.empty(numel, dtype=dtype)  # (N,)
        nf = layout.nfull
        if nf:
            kernels.dequantize_rows(codes[: nf * b].view(nf, b), scales[:nf], out[: nf * b].view(nf, b))
        if layout.tail:
            out[nf * b :].copy_(codes[nf * b :].float() * scales[-1])
        return out.view(shape)

    def estimate_ratio(self, numel: int, dtype: torch.dtype) -> float:
        if numel <= 0:
            return 1.0
        layout = bw.Layout(numel, self.config.block)
        scale_bytes = torch.empty((), dtype=bw.SCALE_DTYPES[self.config.scale]).element_size()
        in_bytes = numel * torch.empty((), dtype=dtype).element_size()
        return in_bytes / (numel + layout.nblocks * scale_bytes)


def _make(*, block: int = 256, scale: str = "bf16") -> Int8Codec:
    return Int8Codec(Int8Config(block=block, scale=scale))


register_codec("int8", _make)
