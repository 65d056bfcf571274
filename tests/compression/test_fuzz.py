"""Hostile encodings: whatever a peer sends, decode returns a tensor or raises CodecError."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geotrain.compression import get_codec, registered_codecs
from geotrain.errors import CodecError

SPECS = [s for s in registered_codecs() if s != "hivemind-blockwise8" or importlib.util.find_spec("bitsandbytes")]

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.lists(st.integers(min_value=-3, max_value=5000), max_size=5),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@pytest.mark.parametrize("spec", SPECS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_decode_never_fails_with_anything_but_codec_error(spec: str, data: st.DataObject) -> None:
    codec = get_codec(spec)
    x = torch.randn(data.draw(st.integers(min_value=0, max_value=600)))
    enc = codec.encode(x)
    meta: dict[str, Any] = dict(enc.meta)
    for key in data.draw(st.lists(st.sampled_from([*meta, "extra"]), max_size=3)):
        meta[key] = data.draw(junk)
    buffers: list[Any] = [bytes(b.view(torch.uint8).numpy().tobytes()) for b in enc.buffers]
    corrupt: bool = data.draw(st.booleans())
    truncate: bool = data.draw(st.booleans())
    if buffers and corrupt:
        i = data.draw(st.integers(min_value=0, max_value=len(buffers) - 1))
        buffers[i] = data.draw(st.binary(max_size=len(buffers[i]) + 8))
    if truncate:
        buffers = buffers[: data.draw(st.integers(min_value=0, max_value=len(buffers) + 1))]
    try:
        y = codec.decode(meta, buffers)
    except CodecError:
        return
    assert isinstance(y, torch.Tensor) and y.device.type == "cpu"
