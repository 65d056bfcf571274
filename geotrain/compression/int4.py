"""``int4``: blockwise absmax quantization to 4-bit codes, two per byte.

Grids (``grid`` option):

- ``int``: uniform codes -7..7 times ``s = max|x| / 7``; error bound per element
  ``s / 2 = max|x in block| / 14``.
- ``e2m1``: the FP4 (E2M1) values +-{0, 0.5, 1, 1.5, 2, 3, 4, 6} times
  ``s = max|x| / 6``: finer near zero, where most of a bell-shaped block lies;
  error bound per element ``s = max|x in block| / 6`` (half the widest gap, 4..6).

Code layout: a nibble is ``sign * 8 + magnitude index`` for ``e2m1`` and
``value + 8`` for ``int``; element ``2i`` goes to the high nibble of byte ``i``.
Spec options: ``block`` (even, 8..65536, default 128), ``scale`` (bf16/fp16/fp32),
``grid`` (``int`` default, ``e2m1``).
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

__all__ = ["Int4Codec", "Int4Config"]

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# fp32 bit pattern of 1.0 shifted to keep one mantissa bit: (127 << 23) >> 22
_E2M1_ONE_BITS = 254
_QMAX = {"int": 7.0, "e2m1": 6.0}


def _nibble_values(grid: str) -> torch.Tensor:
    """Value of each of the 16 nibble codes, shape (16,)."""
    if grid == "int":
        return torch.arange(16, dtype=torch.float32) - 8.0
    mags = torch.tensor(_E2M1, dtype=torch.float32)
    return torch.cat([mags, -mags])


def _byte_table(grid: str) -> torch.Tensor:
    """Both values of each of the 256 bytes, shape (256, 2): decoding is one gather per byte."""
    v = _nibble_values(grid)
    byte = torch.arange(256)
    return torch.stack([v[byte >> 4], v[byte & 15]], dim=1).contiguous()


@dataclass(frozen=True, kw_only=True)
class Int4Config:
    """Options of the ``int4`` codec: elements per block, scale dtype, and the 4-bit grid."""

    block: int = 128
    scale: str = "bf16"
    grid: str = "int"

    def __post_init__(self) -> None:
        if type(self.block) is not int or not 8 <= self.block <= 65536 or self.block % 2:
            raise ConfigError(f"int4 block must be an even int in [8, 65536] (e.g. 128); got {self.block!r}")
        if self.scale not in bw.SCALE_DTYPES:
            raise ConfigError(f"int4 scale must be one of {sorted(bw.SCALE_DTYPES)}; got {self.scale!r}")
        if self.grid not in _QMAX:
            raise ConfigError(f"int4 grid must be one of {sorted(_QMAX)}; got {self.grid!r}")


class Int4Codec(Codec):
    """Blockwise absmax 4-bit quantizer (see module docstring for grids and error bounds)."""

    name = "int4"

    def __init__(self, config: Int4Config) -> None:
        self.config = config
        self._qmax = _QMAX[config.grid]
        self._table = _byte_table(config.grid)  # (256, 2)
        self._kind = "int4" if config.grid == "int" else "e2m1"

    @property
    def spec(self) -> str:
        c = self.config
        return f"int4:block={c.block},scale={c.scale},grid={c.grid}"

    def _codes(self, t: torch.Tensor) -> torch.Tensor:
        """Nibble codes (uint8, same shape) of ``t = x / s`` (fp32, in [-qmax, qmax]); ``t`` is clobbered."""
        if self.config.grid == "int":
            return t.round_().clamp_(-7.0, 7.0).add_(8.0).to(torch.uint8)
        sign = t.signbit()
        a = t.abs_()
        # For a >= 1 the E2M1 index is a's fp32 bits rounded to one mantissa bit (an FP4 value
        # is 2**e * (1 + m/2)); rounding the bit pattern is half the cost of bucketize().
        hi = a.view(torch.int32).add(1 << 21).bitwise_right_shift_(22).sub_(_E2M1_ONE_BITS - 2)
        lo = a.mul(2.0).round_().to(torch.int32)  # below 1 the grid is 0, 0.5, 1: index = round(2a)
        code = torch.where(a < 1.0, lo, hi).clamp_(0, 7)
        return code.add_(sign.to(torch.int32), alpha=8).to(torch.uint8)

    def encode(self, x: torch.Tensor) -> Encoded:
        x = check_input(x)
        flat = x.reshape(-1)  # (N,)
        layout = bw.Layout(flat.numel(), self.config.block)
        packed = torch.empty((layout.numel + 1) // 2, dtype=torch.uint8)  # (ceil(N/2),)
        nf, b = layout.nfull, layout.block
        dst = packed[: nf * b // 2].view(nf, b // 2)
        sent, scales = bw.encode_blocks(flat, layout, self._qmax, self.config.scale, self._kind, dst, codec=self.spec)
        inv = bw.inverse(scales)  # (nblocks,)
        if layout.tail:
            codes = self._codes(flat[nf * b :].float() * inv[-1])
            if codes.numel() % 2:  # pad with the code of 0.0 to fill the last byte
                zero = torch.tensor([8 if self.config.grid == "int" else 0], dtype=torch.uint8)
                codes = torch.cat([codes, zero])
            pairs = codes.view(-1, 2)
            torch.add(pairs[:, 1], pairs[:, 0], alpha=16, out=packed[nf * b // 2 :])
        meta: dict[str, Any] = {
            "shape": list(x.shape),
            "dtype": dtype_name(x.dtype),
            "block": b,
            "scale": bw.scale_wire_name(sent),
        }
        return Encoded(codec=self.spec, meta=meta, buffers=(packed, sent))

    def decode(self, meta: Mapping[str, Any], buffers: Sequence[Buffer]) -> torch.Tensor:
        shape, dtype, numel = read_header(meta, codec=self.name, nbuffers=2, buffers=buffers)
        b = meta_int(meta, "block", codec=self.name, lo=self.config.block, hi=self.config.block)
        scale_dtype = bw.scale_dtype_of(meta, self.config.scale, codec=self.name)
        layout = bw.Layout(numel, b)
        packed = view_buffer(buffers[0], torch.uint8, (numel + 1) // 2, codec=self.name, what="codes")
        scales = bw.read_scales(
            view_buffer(buffers[1], scale_dtype, layout.nblocks, codec=self.name, what="scales"), codec=self.name
        )
        out = torch.empty(numel, dtype=dtype)  # (N,)
        nf = layout.nfull
        if nf:
            kernels.dequantize_rows(
                packed[: nf * b // 2].view(nf, b // 2), scales[:nf], out[: nf * b].view(nf, b), table=self._table
            )
        if layout.tail:
            tail = self._table.index_select(0, packed[nf * b // 2 :].int()).view(-1)[: layout.tail]
            out[nf * b :].copy_(tail * scales[-1])
        return out.view(shape)

    def estimate_ratio(self, numel: int, dtype: torch.dtype) -> float:
        if numel <= 0:
            return 1.0
        layout = bw.Layout(numel, self.config.block)
        scale_bytes = torch.empty((), dtype=bw.SCALE_DTYPES[self.config.scale]).element_size()
        in_bytes = numel * torch.empty((), dtype=dtype).element_size()
        return in_bytes / ((numel + 1) // 2 + layout.nblocks * scale_bytes)


def _make(*, block: int = 128, scale: str = "bf16", grid: str = "int") -> Int4Codec:
    return Int4Codec(Int4Config(block=block, scale=scale, grid=grid))


register_codec("int4", _make)
