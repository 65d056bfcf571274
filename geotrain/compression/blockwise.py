"""Shared machinery of the blockwise quantizers (``int8``, ``int4``).

A **block** is a run of ``block`` consecutive elements of the flattened tensor
that shares one **scale** (its absolute maximum over the largest code). The
last block may be shorter (the **tail**); nothing is padded on the wire.

Speed: the per-block work runs in :mod:`geotrain.compression.kernels` (torch ops
on cache-sized chunks, in single-threaded pool workers); only per-block scale vectors
are handled with torch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from geotrain.compression import kernels
from geotrain.compression.base import raise_nonfinite
from geotrain.errors import CodecError

#: Scale dtypes by config name and by wire name.
SCALE_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SCALE_WIRE: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_WIRE_NAME = {v: k for k, v in SCALE_WIRE.items()}

# Scales below this are treated as an all-zero block: 1/scale must stay finite in fp32.
_TINY = 2.0**-126
# fp16 keeps relative precision only on its normal range; outside it "fp16" falls back to fp32.
_FP16_MIN_NORMAL = 2.0**-14
_FP16_MAX = 65504.0


@dataclass(frozen=True)
class Layout:
    """How ``numel`` elements split into blocks: ``nfull`` full blocks then a ``tail``."""

    numel: int
    block: int

    @property
    def nfull(self) -> int:
        return self.numel // self.block

    @property
    def tail(self) -> int:
        return self.numel - self.nfull * self.block

    @property
    def nblocks(self) -> int:
        return self.nfull + (1 if self.tail else 0)


def absmax(flat: torch.Tensor, layout: Layout) -> torch.Tensor:
    """Per-block max |x| as fp32, shape (nblocks,); NaN in a block gives NaN."""
    out = torch.empty(layout.nblocks, dtype=torch.float32)
    nf, b = layout.nfull, layout.block
    if nf:
        kernels.absmax_rows(flat[: nf * b].view(nf, b), out[:nf])
    if layout.tail:
        out[nf] = flat[nf * b :].abs().amax().float()
    return out


def make_scales(amax: torch.Tensor, qmax: float, scale: str, *, codec: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales to send and their exact fp32 values, from per-block absmax.

    Quantizing with the *transmitted* scale keeps encoder and decoder in
    agreement, so a coarse scale dtype (bf16) costs only a slightly larger step.
    """
    if amax.numel() and not bool(torch.isfinite(amax).all()):
        raise_nonfinite(codec)
    s = amax / qmax  # (nblocks,)
    s = torch.where(s < _TINY, torch.zeros_like(s), s)
    wire = SCALE_DTYPES[scale]
    if wire is torch.float16 and s.numel():
        nonzero_min = torch.where(s > 0, s, torch.full_like(s, 1.0)).amin()
        if float(s.amax()) > _FP16_MAX or float(nonzero_min) < _FP16_MIN_NORMAL:
            wire = torch.float32
    sent = s.to(wire)
    if wire is not torch.float32:
        # round the scale *up* so that |x| / scale <= qmax: codes then need no clamp, and the
        # step grows by at most one ulp of the scale dtype (2**-7 relative for bf16)
        low = sent.float() < s
        if bool(low.any()):
            bits = sent.view(torch.int16)
            sent = torch.where(low, bits + 1, bits).view(wire)  # next float up: positive bit patterns are ordered
    return sent, sent.float()


def encode_blocks(flat: torch.Tensor, layout: Layout, qmax: float, scale: str, kind: str,
                  codes: torch.Tensor, *, codec: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize the full blocks of ``flat`` into ``codes`` (one row per block, see
    :func:`kernels.quantize_chunk`); return (scales as sent, their fp32 values), tail's included.

    With bf16/fp32 scales each chunk is one task: absmax, scales and codes while the
    chunk is in cache (one read of the input from memory). fp16 scales may fall back
    to fp32 for the whole encoding, so there all scales come first, then the codes.
    """
    nf, b = layout.nfull, layout.block
    if scale == "fp16":
        sent, scales = make_scales(absmax(flat, layout), qmax, scale, codec=codec)
        if nf:
            kernels.quantize_rows(flat[: nf * b].view(nf, b), inverse(scales)[:nf], codes, kind=kind)
        return sent, scales
    sent = torch.empty(layout.nblocks, dtype=SCALE_DTYPES[scale])
    if nf:
        x = flat[: nf * b].view(nf, b)  # (nfull, block)

        def task(r0: int, r1: int) -> None:
            c = x[r0:r1]
            amax = torch.maximum(c.amax(dim=1), c.amin(dim=1).neg()).float()  # (rows,)
            chunk_sent, chunk_scales = make_scales(amax, qmax, scale, codec=codec)
            sent[r0:r1] = chunk_sent
            kernels.quantize_chunk(c, inverse(chunk_scales), codes[r0:r1], kind)

        kernels.parallel_rows(nf, b, task)
    if layout.tail:
        tail_amax = flat[nf * b :].abs().amax().float().reshape(1)
        sent[nf:] = make_scales(tail_amax, qmax, scale, codec=codec)[0]
    return sent, sent.float()


def inverse(scales: torch.Tensor) -> torch.Tensor:
    """1/scale, with 0 for all-zero blocks (their codes become 0)."""
    return torch.where(scales > 0, scales.reciprocal(), torch.zeros_like(scales))


def scale_wire_name(sent: torch.Tensor) -> str:
    return _WIRE_NAME[sent.dtype]


def read_scales(buf: torch.Tensor, *, codec: str) -> torch.Tensor:
    """Validate decoded scales (finite, >= 0) and return them as fp32."""
    s = buf.float()
    if s.numel() and not bool((torch.isfinite(s) & (s >= 0)).all()):
        raise CodecError(f"{codec}: scales must be finite and non-negative; the encoding is corrupted")
    return s


def scale_dtype_of(meta: Mapping[str, Any], configured: str, *, codec: str) -> torch.dtype:
    """The scale dtype an encoding declares; "fp16" encodings may fall back to fp32."""
    wire = meta.get("scale")
    allowed = {SCALE_DTYPES[configured]}
    if configured == "fp16":
        allowed.add(torch.float32)
    dtype = SCALE_WIRE.get(wire) if isinstance(wire, str) else None
    if dtype is None or dtype not in allowed:
        raise CodecError(f"{codec}: meta['scale'] {wire!r} does not match the codec's scale {configured!r}")
    return dtype
