"""geotrain codecs as hivemind CompressionBase, and hivemind codecs through our interface."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from hivemind.compression import deserialize_torch_tensor
from hivemind.compression.base import CompressionInfo

from geotrain.compression import HivemindCodec, get_codec, to_hivemind
from geotrain.errors import CodecError

HAVE_BNB = importlib.util.find_spec("bitsandbytes") is not None


@pytest.mark.parametrize("spec", ["none", "fp16"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_cast_codecs_speak_hivemind_formats_exactly(spec: str, dtype: torch.dtype) -> None:
    x = torch.randn(7, 129).to(dtype)
    comp = to_hivemind(spec)
    proto = comp.compress(x, CompressionInfo.from_tensor(x))
    ours = get_codec(spec)
    expected = ours.decode(ours.encode(x).meta, ours.encode(x).buffers)
    assert torch.equal(deserialize_torch_tensor(proto), expected)  # a plain hivemind peer reads it
    assert torch.equal(comp.extract(proto), expected)
    assert comp.estimate_compression_ratio(CompressionInfo.from_tensor(x)) == pytest.approx(
        1.0 / ours.estimate_ratio(x.numel(), dtype)
    )


def test_int8_maps_onto_blockwise_8bit() -> None:
    x = torch.randn(3 * 4096 + 17)  # a partial last block too
    spec = "int8:block=4096,scale=fp32"
    comp = to_hivemind(spec)
    proto = comp.compress(x, CompressionInfo.from_tensor(x))
    ours = get_codec(spec)
    enc = ours.encode(x)
    expected = ours.decode(enc.meta, enc.buffers)
    got = comp.extract(proto)  # torch-only decoder: no bitsandbytes needed
    # hivemind's format multiplies codebook[q] = q/127 by 127*scale: equal up to fp32 rounding
    assert torch.allclose(got, expected, rtol=1e-6, atol=1e-7)
    assert len(proto.buffer) == enc.nbytes + 16 + 256 * 4  # + hivemind's counts and codebook
    if HAVE_BNB:
        assert torch.allclose(deserialize_torch_tensor(proto), expected, rtol=1e-6, atol=1e-7)


def test_extract_validates_before_allocating() -> None:
    comp = to_hivemind("int8:block=4096,scale=fp32")
    x = torch.randn(5000)
    proto = comp.compress(x, CompressionInfo.from_tensor(x))
    proto.buffer = proto.buffer[:-1]
    with pytest.raises(CodecError):
        comp.extract(proto)
    proto = comp.compress(x, CompressionInfo.from_tensor(x))
    del proto.size[:]
    proto.size.extend([1 << 30, 1 << 30])  # int32 dims, product far beyond the cap
    with pytest.raises(CodecError):
        comp.extract(proto)


@pytest.mark.parametrize("spec", ["int4", "topk", "int8", "bf16"])
def test_codecs_without_an_exact_hivemind_format_are_refused(spec: str) -> None:
    with pytest.raises(CodecError, match="no exact hivemind format"):
        to_hivemind(spec)


def test_hivemind_codecs_are_usable_through_our_interface() -> None:
    codec = get_codec("hivemind-uniform8")
    assert isinstance(codec, HivemindCodec)
    x = torch.randn(20000)
    enc = codec.encode(x)
    y = codec.decode(enc.meta, enc.buffers)
    assert float((y - x).norm() / x.norm()) < 0.03
    assert enc.nbytes == 8 + 256 * 4 + x.numel()
