"""Spec parsing and the registry."""

from __future__ import annotations

import pytest
import torch

from geotrain.compression import get_codec, parse_spec, register_codec, registered_codecs
from geotrain.errors import CodecError


def test_parse_spec_types() -> None:
    assert parse_spec("int8") == ("int8", {})
    assert parse_spec("topk:fraction=0.01,values=fp16,exact=true") == (
        "topk",
        {"fraction": 0.01, "values": "fp16", "exact": True},
    )
    assert parse_spec("int8:block=64") == ("int8", {"block": 64})


@pytest.mark.parametrize("bad", ["", ":", "int8:block", "int8:block=", "int8:=3", "int8:block=1,block=2"])
def test_parse_spec_rejects(bad: str) -> None:
    with pytest.raises(CodecError):
        get_codec(bad)


def test_unknown_codec_and_option() -> None:
    with pytest.raises(CodecError, match="unknown codec"):
        get_codec("zstd")
    with pytest.raises(CodecError, match="bad options"):
        get_codec("fp16:colour=blue")


def test_builtins_registered_and_spec_roundtrips() -> None:
    names = registered_codecs()
    for name in ("none", "fp16", "bf16"):
        assert name in names
        codec = get_codec(name)
        assert get_codec(codec.spec).spec == codec.spec


def test_register_twice_refused() -> None:
    with pytest.raises(CodecError, match="already registered"):
        register_codec("fp16", lambda: get_codec("none"))


def test_fp16_overflow_is_an_error_not_inf() -> None:
    with pytest.raises(CodecError, match="bf16"):
        get_codec("fp16").encode(torch.tensor([1e6, 1.0]))
    codec = get_codec("fp16")
    for ok in (65504.0, 65519.0, -65504.0):  # these round to +-65504, not to inf
        enc = codec.encode(torch.tensor([ok]))
        assert abs(float(codec.decode(enc.meta, enc.buffers)[0])) == 65504.0
    with pytest.raises(CodecError):
        codec.encode(torch.tensor([-65520.0]))
    # bf16 keeps fp32's range
    y = get_codec("bf16").encode(torch.tensor([1e6, 1.0]))
    assert y.nbytes == 4
