"""Hostile bytes at a live endpoint: each gives a typed, counted drop; the endpoint keeps serving."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import pytest
import torch
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geotrain.errors import PeerTimeoutError, ProtocolError
from geotrain.transport import Limits, Message, Transport, TransportConfig
from geotrain.transport.wire import unpack_header

LIMITS = Limits(max_frame_bytes=1 << 20, max_message_bytes=1 << 22)


def header(**fields: object) -> bytes:
    base = {"v": 1, "kind": "act", "tag": [], "sender": "evil", "job": "", "plan": 0, "step": 0, "meta": {}, "tensors": []}
    base.update(fields)
    return msgpack.packb(base, use_bin_type=True)


def raw_tensor(dtype: str, shape: list[int], nbytes: int) -> dict[str, object]:
    return {"name": "x", "codec": "raw", "meta": {"dtype": dtype, "shape": shape}, "frames": [nbytes]}


def deep(n: int) -> bytes:
    # n nested one-element arrays, written by hand so no encoder recursion is needed
    return b"\x91" * n + b"\xc0"


# name -> (frames, where it is caught: "door" = by the I/O thread, "decode" = when a reader decodes)
BAD_MESSAGES: dict[str, tuple[list[bytes], str]] = {
    "garbage": ([b"\xff\x00garbage"], "door"),
    "truncated_header": ([header()[:-3]], "door"),
    "not_a_map": ([msgpack.packb([1, 2, 3])], "door"),
    "wrong_version": ([header(v=99)], "door"),
    "bad_kind": ([header(kind="")], "door"),
    "deep_nesting": ([b"\x81\xa4meta" + deep(5000)], "door"),
    "amplification": ([b"\x81\xa4meta" + b"\xdd\x00\x00\x14\x00" + b"\xc0" * 0x1400], "door"),
    "ext_type": ([header(meta={"x": msgpack.ExtType(1, b"\x00" * 8)})], "door"),
    "frame_count_lies": ([header(tensors=[raw_tensor("float32", [4], 16)])], "door"),
    "length_lies": ([header(tensors=[raw_tensor("float32", [4], 16)]), b"\x00" * 12], "door"),
    "trailing_junk": ([header(tensors=[raw_tensor("float32", [4], 16)]), b"\x00" * 16, b"junk"], "door"),
    "header_too_large": ([header(tag=["y" * 4000] * 16, meta={"pad": "x" * 4000})], "door"),
    "too_many_frames": ([header(), *([b""] * 2000)], "door"),
    "shape_vs_bytes": ([header(tensors=[raw_tensor("float32", [5], 16)]), b"\x00" * 16], "decode"),
    "huge_shape": ([header(tensors=[raw_tensor("float32", [2**30, 2**30], 16)]), b"\x00" * 16], "decode"),
    "negative_dim": ([header(tensors=[raw_tensor("float32", [-4], 16)]), b"\x00" * 16], "decode"),
    "unknown_dtype": ([header(tensors=[raw_tensor("complex128", [1], 16)]), b"\x00" * 16], "decode"),
    "unknown_codec": ([header(tensors=[{"name": "x", "codec": "zstd9", "meta": {}, "frames": [4]}]), b"\x00" * 4], "decode"),
    "pickle_payload": (
        [header(tensors=[{"name": "x", "codec": "pickle", "meta": {}, "frames": [5]}]), b"\x80\x04K\x01."],
        "decode",
    ),
    "fp16_meta_lies": (
        [header(tensors=[{"name": "x", "codec": "fp16", "meta": {"shape": [9], "dtype": "float32"}, "frames": [4]}]), b"\x00" * 4],
        "decode",
    ),
}


@pytest.fixture
def victim() -> Iterator[Transport]:
    t = Transport(TransportConfig(limits=LIMITS), peer_id="victim").start()
    try:
        yield t
    finally:
        t.close()


@pytest.mark.parametrize("case", sorted(BAD_MESSAGES))
def test_bad_message_is_dropped_counted_and_endpoint_keeps_serving(victim: Transport, case: str) -> None:
    frames, where = BAD_MESSAGES[case]
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(victim.address)
    try:
        sock.send_multipart(frames)
        sock.send_multipart([header(kind="after")])  # same connection: processed after the bad one
        victim.recv("after", timeout=10)
        before = sum(victim.stats.dropped.values())
        if where == "decode":
            assert before == 0
            with pytest.raises(PeerTimeoutError):
                victim.recv("act", timeout=0.5)  # the reader skips the bad tensor, finds nothing else
        dropped = victim.stats.dropped
        assert sum(dropped.values()) == 1, dropped
        assert set(dropped) <= {"ProtocolError", "FrameTooLargeError", "BadTensorError"}
    finally:
        sock.close()
    # an honest peer is still served
    good = Transport(TransportConfig(), peer_id="good").start()
    try:
        good.connect("victim", victim.address)
        good.send("victim", Message(kind="act", tag=(1,), tensors={"x": torch.ones(3)}))
        assert torch.equal(victim.recv("act", (1,), timeout=10).tensors["x"], torch.ones(3))
    finally:
        good.close()


def test_oversized_frame_is_refused_by_zmq_and_endpoint_survives(victim: Transport) -> None:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(victim.address)
    sock.send_multipart([header(), b"\x00" * (LIMITS.max_frame_bytes + 1)])
    sock.close()
    good = Transport(TransportConfig(), peer_id="good").start()
    try:
        good.connect("victim", victim.address)
        good.send("victim", Message(kind="ok"))
        assert victim.recv("ok", timeout=10).sender == "good"
    finally:
        good.close()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_unpack_header_only_raises_protocol_errors(raw: bytes) -> None:
    try:
        unpack_header(raw, LIMITS)
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["v", "kind", "tag", "sender", "job", "plan", "step", "meta", "tensors", "rpc"]),
        st.recursive(
            st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20) | st.binary(max_size=20),
            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
            max_leaves=20,
        ),
    )
)
def test_structured_garbage_headers_only_raise_protocol_errors(fields: dict[str, object]) -> None:
    try:
        unpack_header(msgpack.packb({"v": 1, **fields}, use_bin_type=True), LIMITS)
    except ProtocolError:
        pass
