"""``topk``: keep the largest-magnitude entries of each chunk, drop the rest.

A **chunk** is a run of ``chunk`` consecutive elements of the flattened tensor
(the last one is zero-padded on the encoder side only). In each chunk the
``k = max(1, round(fraction * chunk))`` entries of largest |x| are kept: their
position as a uint16 index within the chunk and their value, quantized
(``values=int8``: absmax per chunk; ``fp16``/``bf16``: a cast). Dropped entries
decode as 0, so the error is the mass of everything not kept; it is meant to be
used under :class:`~geotrain.compression.feedback.ErrorFeedback`, which sends
that mass later. Error bound on kept entries (int8): ``max|kept in chunk| / 254``.

Tensors smaller than ``chunk`` use one chunk of their own size. Wire per chunk:
``k`` * (2 + value bytes) + 4 (fp32 scale, int8 only). Spec options:
``fraction`` (default 0.01), ``chunk`` (16..65536, default 4096), ``values``.
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
    raise_nonfinite,
    read_header,
    register_codec,
    view_buffer,
)
from geotrain.errors import CodecError, ConfigError

__all__ = ["TopKCodec", "TopKConfig"]

_VALUE_DTYPES = {"int8": torch.int8, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True, kw_only=True)
class TopKConfig:
    """Options of the ``topk`` codec: kept fraction, chunk length, and how kept values are sent."""

    fraction: float = 0.01
    chunk: int = 4096
    values: str = "int8"

    def __post_init__(self) -> None:
        if not isinstance(self.fraction, int | float) or not 0.0 < float(self.fraction) <= 0.5:
            raise ConfigError(f"topk fraction must be in (0, 0.5] (e.g. 0.01); got {self.fraction!r}")
        if type(self.chunk) is not int or not 16 <= self.chunk <= 65536:
            raise ConfigError(f"topk chunk must be an int in [16, 65536] (uint16 indices); got {self.chunk!r}")
        if self.values not in _VALUE_DTYPES:
            raise ConfigError(f"topk values must be one of {sorted(_VALUE_DTYPES)}; got {self.values!r}")


class TopKCodec(Codec):
    """Chunked magnitude top-k with compact indices and quantized values (see module docstring)."""

    name = "topk"

    def __init__(self, config: TopKConfig) -> None:
        self.config = config
        self._vdtype = _VALUE_DTYPES[config.values]

    @property
    def spec(self) -> str:
        c = self.config
        return f"topk:fraction={float(c.fraction)!r},chunk={c.chunk},values={c.values}"

    def geometry(self, numel: int) -> tuple[int, int, int]:
        """(chunk length, number of chunks, kept per chunk) for a tensor of ``numel`` elements."""
        if numel == 0:
            return self.config.chunk, 0, 0
        c = min(self.config.chunk, numel)
        k = max(1, min(c, round(float(self.config.fraction) * c)))
        return c, -(-numel // c), k

    def encode(self, x: torch.Tensor) -> Encoded:
        x = check_input(x)
        flat = x.reshape(-1)  # (N,)
        n = flat.numel()
        c, nc, k = self.geometry(n)
        if nc * c != n:  # zero-pad the last chunk; padding is never the top-k unless the chunk is all zero
            padded = torch.zeros(nc * c, dtype=flat.dtype)
            padded[:n].copy_(flat)
            flat = padded
        rows = flat.view(nc, c)  # (nc, c)
        idx = torch.empty(nc, k, dtype=torch.int64)
        vals = torch.empty(nc, k, dtype=torch.float32)

        def select(r0: int, r1: int) -> None:
            # |x| of ~4 MiB at a time: a full-size |x| temporary would cost more than topk itself
            _, i = torch.topk(rows[r0:r1].abs(), k, dim=1, sorted=False)  # NaN ranks first
            idx[r0:r1] = i
            vals[r0:r1] = torch.gather(rows[r0:r1], 1, i)  # signed values, cast to fp32

        kernels.parallel_rows(nc, c, select)
        meta: dict[str, Any] = {"shape": list(x.shape), "dtype": dtype_name(x.dtype), "chunk": c, "k": k}
        if not bool(torch.isfinite(vals).all()):
            raise_nonfinite(self.spec)
        if self._vdtype == torch.int8:
            sent, scales = bw.make_scales(vals.abs().amax(dim=1) if nc else vals.new_empty(0), 127.0, "fp32",
                                          codec=self.spec)
            q = (vals * bw.inverse(scales)[:, None]).round_().clamp_(-127, 127).to(torch.int8)
            buffers: tuple[torch.Tensor, ...] = (idx.to(torch.uint16).view(-1), q.view(-1), sent)
        else:
            v = vals.to(self._vdtype)
            if not bool(torch.isfinite(v).all()):
                raise CodecError(f"codec {self.spec!r}: kept values overflow {self.config.values}; use values=int8")
            buffers = (idx.to(torch.uint16).view(-1), v.view(-1))
        return Encoded(codec=self.spec, meta=meta, buffers=buffers)

    def decode(self, meta: Mapping[str, Any], buffers: Sequence[Buffer]) -> torch.Tensor:
        is_int8 = self._vdtype == torch.int8
        shape, dtype, numel = read_header(meta, codec=self.name, nbuffers=3 if is_int8 else 2, buffers=buffers)
        c, nc, k = self.geometry(numel)
        meta_int(meta, "chunk", codec=self.name, lo=c, hi=c)
        meta_int(meta, "k", codec=self.name, lo=k, hi=k)
        idx = view_buffer(buffers[0], torch.uint16, nc * k, codec=self.name, what="indices")
        vals = view_buffer(buffers[1], self._vdtype, nc * k, codec=self.name, what="values").float()
        if is_int8:
            scales = bw.read_scales(view_buffer(buffers[2], torch.float32, nc, codec=self.name, what="scales"),
                                    codec=self.name)
            vals = vals.view(nc, k).mul_(scales[:, None])
        elif vals.numel() and not bool(torch.isfinite(vals).all()):
            raise CodecError(f"{self.name}: non-finite values in the encoding; it is corrupted")
        index = idx.to(torch.int64).view(nc, k)
        if c < 65536 and index.numel() and int(index.max()) >= c:
            raise CodecError(f"{self.name}: index beyond the chunk of {c}; the encoding is corrupted")
        full = torch.empty(nc * c, dtype=dtype)  # (nc * c,): the last chunk's padding is cut below
        rows, kept = full.view(nc, c), vals.view(nc, k)

        def scatter(r0: int, r1: int) -> None:
            rows[r0:r1].zero_().scatter_(1, index[r0:r1], kept[r0:r1].to(dtype))

        kernels.parallel_rows(nc, c, scatter)
        return full[:numel].view(shape)

    def estimate_ratio(self, numel: int, dtype: torch.dtype) -> float:
        if numel <= 0:
            return 1.0
        _, nc, k = self.geometry(numel)
        per_value = 1 if self._vdtype == torch.int8 else 2
        out = nc * k * (2 + per_value) + (nc * 4 if self._vdtype == torch.int8 else 0)
        return numel * torch.empty((), dtype=dtype).element_size() / out


def _make(*, fraction: float = 0.01, chunk: int = 4096, values: str = "int8") -> TopKCodec:
    return TopKCodec(TopKConfig(fraction=fraction, chunk=chunk, values=values))


register_codec("topk", _make)
