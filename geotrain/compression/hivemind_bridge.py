"""Adapters between geotrain codecs and hivemind's ``CompressionBase``, both ways.

- :func:`to_hivemind` wraps a geotrain codec as a hivemind ``CompressionBase``
  where hivemind has a wire format that carries our encoding exactly: ``none``
  -> ``NONE``, ``fp16`` -> ``FLOAT16``, ``int8:block=4096,scale=fp32`` ->
  ``BLOCKWISE_8BIT`` (our codes with a linear codebook ``(i - 128) / 127`` and
  absmax ``= 127 * scale``). A plain hivemind peer decodes what it produces;
  its ``extract`` decodes those formats with torch alone (no bitsandbytes) and
  checks every length first. Other codecs have no exact hivemind format and
  are refused.
- :class:`HivemindCodec` wraps hivemind's own codecs in our interface, so the
  benchmark and the contract test drive both through one harness. Registered
  as ``hivemind-fp16``, ``hivemind-uniform8``, ``hivemind-quantile8`` and
  ``hivemind-blockwise8`` (the last needs the ``bitsandbytes`` package).

hivemind is imported lazily: importing geotrain.compression stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from geotrain.compression.base import (
    Buffer,
    Codec,
    Encoded,
    check_input,
    dtype_name,
    get_codec,
    raise_nonfinite,
    read_header,
    register_codec,
    view_buffer,
)
from geotrain.compression.cast import CastCodec
from geotrain.compression.int8 import Int8Codec
from geotrain.errors import CodecError, ConfigError

__all__ = ["HivemindCodec", "HivemindCodecConfig", "to_hivemind"]

#: our name -> (hivemind class name, CompressionType name)
HIVEMIND_KINDS = {
    "fp16": ("Float16Compression", "FLOAT16"),
    "uniform8": ("Uniform8BitQuantization", "UNIFORM_8BIT"),
    "quantile8": ("Quantile8BitQuantization", "QUANTILE_8BIT"),
    "blockwise8": ("BlockwiseQuantization", "BLOCKWISE_8BIT"),
}
_BNB_BLOCK = 4096  # hivemind's fixed BLOCKWISE_8BIT block size
_NBINS = 256


def _expected_nbytes(kind: str, numel: int) -> int:
    """Exact payload size of a hivemind encoding, from its format (serialization of hivemind 1.1.12)."""
    if kind == "fp16":
        return 2 * numel
    if kind in ("uniform8", "quantile8"):  # int64 codebook size | fp32 codebook | uint8 codes
        return 8 + 4 * _NBINS + numel
    nblocks = -(-numel // _BNB_BLOCK)  # int64 | int64 | fp32 absmax | fp32 codebook | uint8 codes
    return 16 + 4 * nblocks + 4 * _NBINS + numel


@dataclass(frozen=True, kw_only=True)
class HivemindCodecConfig:
    """Which hivemind codec to wrap; ``check_finite`` adds the NaN/Inf check hivemind lacks."""

    kind: str
    check_finite: bool = True

    def __post_init__(self) -> None:
        if self.kind not in HIVEMIND_KINDS:
            raise ConfigError(f"hivemind codec kind must be one of {sorted(HIVEMIND_KINDS)}; got {self.kind!r}")


class HivemindCodec(Codec):
    """One of hivemind's codecs behind our interface (its protobuf buffer is our one raw buffer)."""

    def __init__(self, config: HivemindCodecConfig) -> None:
        import importlib.util

        import hivemind.compression as hc

        if config.kind == "blockwise8" and importlib.util.find_spec("bitsandbytes") is None:
            raise CodecError("hivemind's BlockwiseQuantization needs the bitsandbytes package; install it")
        self.config = config
        self.name = f"hivemind-{config.kind}"
        cls_name, type_name = HIVEMIND_KINDS[config.kind]
        self.impl = getattr(hc, cls_name)()
        self._type_name = type_name

    @property
    def spec(self) -> str:
        return self.name if self.config.check_finite else f"{self.name}:check_finite=false"

    def encode(self, x: torch.Tensor) -> Encoded:
        from hivemind.compression.base import CompressionInfo

        x = check_input(x)
        meta: dict[str, Any] = {"shape": list(x.shape), "dtype": dtype_name(x.dtype)}
        if x.numel() == 0:  # hivemind's quantizers divide by numel - 1
            return Encoded(codec=self.spec, meta=meta, buffers=(torch.empty(0, dtype=torch.uint8),))
        if self.config.check_finite and not bool(torch.isfinite(x).all()):
            raise_nonfinite(self.spec)
        x32 = x.float()  # hivemind's fp16/uniform codecs refuse bf16; it records dtype by numpy name
        proto = self.impl.compress(x32.reshape(-1), CompressionInfo.from_tensor(x32))
        payload = view_buffer(proto.buffer, torch.uint8, len(proto.buffer), codec=self.name, what="payload")
        return Encoded(codec=self.spec, meta=meta, buffers=(payload,))

    def decode(self, meta: Mapping[str, Any], buffers: Sequence[Buffer]) -> torch.Tensor:
        from hivemind.proto import runtime_pb2

        shape, dtype, numel = read_header(meta, codec=self.name, nbuffers=1, buffers=buffers)
        expected = _expected_nbytes(self.config.kind, numel) if numel else 0
        payload = view_buffer(buffers[0], torch.uint8, expected, codec=self.name, what="payload")
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        if self.config.kind != "fp16":
            header = payload[: 16 if self.config.kind == "blockwise8" else 8].view(torch.int64).tolist()
            want = [-(-numel // _BNB_BLOCK), _NBINS] if self.config.kind == "blockwise8" else [_NBINS]
            if header != want:
                raise CodecError(f"{self.name}: size header {header} does not match {want}; corrupted encoding")
        proto = runtime_pb2.Tensor(
            compression=runtime_pb2.CompressionType.Value(self._type_name),
            buffer=payload.numpy().tobytes(),
            size=[numel],
            dtype="float32",
            requires_grad=False,
        )
        return self.impl.extract(proto).detach().to(dtype).view(shape)

    def estimate_ratio(self, numel: int, dtype: torch.dtype) -> float:
        if numel <= 0:
            return 1.0
        return numel * torch.empty((), dtype=dtype).element_size() / _expected_nbytes(self.config.kind, numel)


def _hivemind_factory(kind: str) -> Any:
    def make(*, check_finite: bool = True) -> HivemindCodec:
        return HivemindCodec(HivemindCodecConfig(kind=kind, check_finite=check_finite))

    return make


for _kind in HIVEMIND_KINDS:
    register_codec(f"hivemind-{_kind}", _hivemind_factory(_kind))


# -- geotrain -> hivemind ---------------------------------------------------------------------------
def _linear_codebook() -> torch.Tensor:
    return (torch.arange(_NBINS, dtype=torch.float32) - 128.0) / 127.0  # (256,)


def to_hivemind(codec: Codec | str) -> Any:
    """A hivemind ``CompressionBase`` that sends ``codec``'s encoding in a hivemind wire format.

    Raises CodecError for codecs hivemind cannot carry exactly.
    """
    from hivemind.compression.base import CompressionBase, CompressionInfo
    from hivemind.proto import runtime_pb2

    c = get_codec(codec) if isinstance(codec, str) else codec
    if isinstance(c, CastCodec) and c.name in ("none", "fp16"):
        type_name = "NONE" if c.name == "none" else "FLOAT16"
    elif isinstance(c, Int8Codec) and c.config.block == _BNB_BLOCK and c.config.scale == "fp32":
        type_name = "BLOCKWISE_8BIT"
    else:
        raise CodecError(
            f"codec {c.spec!r} has no exact hivemind format; use 'none', 'fp16' or 'int8:block=4096,scale=fp32'"
        )

    class GeotrainCompression(CompressionBase):
        compression_type = runtime_pb2.CompressionType.Value(type_name)

        def compress(self, tensor: torch.Tensor, info: CompressionInfo, allow_inplace: bool = False) -> Any:
            if tensor.dtype == torch.bfloat16 and type_name == "FLOAT16":
                raise CodecError("hivemind's FLOAT16 format cannot name bf16; use 'none' or 'int8' for bf16")
            enc = c.encode(tensor)
            if type_name == "BLOCKWISE_8BIT":
                codes, scales = enc.buffers
                absmax = scales * 127.0  # (nblocks,) hivemind keeps absmax, we keep absmax / 127
                quantized = codes.view(torch.uint8) ^ 0x80  # two's complement q -> q + 128
                counts = torch.tensor([absmax.numel(), _NBINS], dtype=torch.int64)
                parts = (counts, absmax, _linear_codebook(), quantized)
                buffer = b"".join(p.numpy().tobytes() for p in parts)
            else:
                buffer = enc.buffers[0].view(torch.uint8).numpy().tobytes()
            return runtime_pb2.Tensor(
                compression=self.compression_type,
                buffer=buffer,
                size=list(tensor.shape),
                dtype=dtype_name(tensor.dtype),
                requires_grad=tensor.requires_grad,
            )

        def extract(self, serialized_tensor: Any) -> torch.Tensor:
            return _extract(type_name, serialized_tensor)

        def estimate_compression_ratio(self, info: CompressionInfo) -> float:
            # hivemind's convention is the inverse of ours: compressed size / original size
            return 1.0 / c.estimate_ratio(info.descriptor.numel(), info.descriptor.dtype)

        def __repr__(self) -> str:
            return f"geotrain.{c.spec}->hivemind.{type_name}"

    return GeotrainCompression()


def _extract(type_name: str, t: Any) -> torch.Tensor:
    """Decode a hivemind NONE/FLOAT16/BLOCKWISE_8BIT tensor with torch, validating sizes first."""
    meta = {"shape": list(t.size), "dtype": t.dtype}
    shape, dtype, numel = read_header(meta, codec=f"hivemind.{type_name}", nbuffers=1, buffers=[t.buffer])
    buf = t.buffer
    if type_name == "NONE":
        out = get_codec("none").decode({**meta, "wire": t.dtype}, [buf])
    elif type_name == "FLOAT16":
        out = get_codec("fp16").decode({**meta, "wire": "float16"}, [buf])
    else:
        nblocks = -(-numel // _BNB_BLOCK)
        raw = view_buffer(buf, torch.uint8, _expected_nbytes("blockwise8", numel), codec="hivemind", what="payload")
        if raw[:16].view(torch.int64).tolist() != [nblocks, _NBINS]:
            raise CodecError("hivemind BLOCKWISE_8BIT: size header disagrees with the tensor size")
        absmax = raw[16 : 16 + 4 * nblocks].view(torch.float32)
        code = raw[16 + 4 * nblocks : 16 + 4 * (nblocks + _NBINS)].view(torch.float32)
        q = raw[16 + 4 * (nblocks + _NBINS) :]
        if not bool(torch.isfinite(absmax).all() & torch.isfinite(code).all()):
            raise CodecError("hivemind BLOCKWISE_8BIT: non-finite absmax or codebook")
        values = code[q.long()]  # (N,)
        pad = nblocks * _BNB_BLOCK - numel
        if pad:
            values = torch.cat([values, values.new_zeros(pad)])
        out = values.view(nblocks, _BNB_BLOCK).mul_(absmax[:, None]).view(-1)[:numel].to(dtype)
    return out.view(shape).requires_grad_(bool(t.requires_grad))
