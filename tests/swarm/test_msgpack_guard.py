"""The pre-decode scan and the process-wide guard in front of hivemind's msgpack decoding."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.errors import RecordError
from geotrain.swarm.msgpack_guard import TUPLE_EXT, scan_msgpack, strip_signatures


def nested_tuples(levels: int) -> bytes:
    """hivemind's encoding of ``(((...(1,)...),),)``: each level an ext 0x40 holding a 1-array."""
    b = msgpack.packb(1)
    for _ in range(levels):
        b = msgpack.packb(msgpack.ExtType(TUPLE_EXT, b"\x91" + b))
    return b


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(json_like)
def test_honest_values_pass_and_depth_is_exact(value: object) -> None:
    packed = msgpack.packb(value, use_bin_type=True)
    depth = scan_msgpack(packed, max_depth=64)
    assert depth == _depth(value)
    if depth > 0:
        with pytest.raises(RecordError, match="nested deeper"):
            scan_msgpack(packed, max_depth=depth - 1)


def _depth(v: object) -> int:
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    if isinstance(v, dict):
        return 1 + max((max(_depth(k), _depth(x)) for k, x in v.items()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_gives_record_error_or_a_structurally_sound_object(data: bytes) -> None:
    try:
        scan_msgpack(data, max_depth=8)
    except RecordError:
        return
    # Passing the scan means msgpack can walk it without structural errors (it may still
    # refuse content such as invalid UTF-8, which is a plain ValueError, not a crash).
    try:
        msgpack.unpackb(data, raw=True, strict_map_key=False)
    except (ValueError, TypeError) as e:
        assert "ExtraData" not in type(e).__name__ and "OutOfData" not in type(e).__name__


@pytest.mark.parametrize(
    "data, match",
    [
        (b"", "truncated"),
        (b"\x92\x01", "declared length"),  # array of 2, one item
        (b"\xc1", "reserved"),
        (b"\x01\x02", "trailing"),
        (b"\xdd\xff\xff\xff\xff", "declared length"),  # array32 of 4G items in 5 bytes
        (b"\xc4\x05ab", "truncated"),  # bin8 claims 5 bytes, has 2
        (b"\xc7\x03\x40\x91\x01\x01", "fill its extension"),  # tuple ext whose payload has an extra byte
    ],
)
def test_malformed_input_is_refused(data: bytes, match: str) -> None:
    with pytest.raises(RecordError, match=match):
        scan_msgpack(data, max_depth=8)


def test_tuples_count_two_levels_and_deep_nesting_is_refused_without_recursion() -> None:
    assert scan_msgpack(nested_tuples(3), max_depth=10) == 6
    with pytest.raises(RecordError, match="nested deeper than 48"):
        scan_msgpack(nested_tuples(3000), max_depth=48)  # 3000 levels: far past the C-stack crash


def test_size_limit() -> None:
    with pytest.raises(RecordError, match="exceeds the limit"):
        scan_msgpack(msgpack.packb(b"x" * 100), max_bytes=50, max_depth=4)


def test_strip_signatures_matches_hivemind() -> None:
    from hivemind.dht.crypto import RSASignatureValidator
    from hivemind.dht.validation import DHTRecord

    value = msgpack.packb({"a": 1}) + b"[signature:abc=]"
    record = DHTRecord(b"k", b"s", value, 1.0)
    assert (
        strip_signatures(value) == RSASignatureValidator(None).strip_value(record) == msgpack.packb({"a": 1})
    )


_CHILD = textwrap.dedent(
    """
    import sys, msgpack
    from hivemind.utils import MSGPackSerializer
    if sys.argv[1] == "guarded":
        from geotrain.swarm.msgpack_guard import install_decode_guard
        install_decode_guard()
    b = msgpack.packb(1)
    for _ in range(2000):
        b = msgpack.packb(msgpack.ExtType(0x40, b"\\x91" + b))
    try:
        MSGPackSerializer.loads(b)
    except ValueError as e:
        print("refused:", type(e).__name__)
        sys.exit(0)
    print("decoded")
    """
)


@pytest.mark.multiprocess
def test_guard_turns_a_crash_into_an_error() -> None:
    """Without the guard hivemind's decoder dies of SIGSEGV; with it, a ValueError is raised."""
    bare = subprocess.run([sys.executable, "-c", _CHILD, "bare"], capture_output=True, text=True, timeout=60)
    assert bare.returncode < 0, (
        f"expected hivemind to crash on deep tuples; got {bare.returncode} {bare.stdout}"
    )
    guarded = subprocess.run(
        [sys.executable, "-c", _CHILD, "guarded"], capture_output=True, text=True, timeout=60
    )
    assert guarded.returncode == 0 and "refused: RecordError" in guarded.stdout, guarded.stderr[-2000:]


def test_guarded_dictionary_drops_only_the_poisoned_item() -> None:
    from hivemind.dht.storage import DictionaryDHTValue
    from hivemind.utils import MSGPackSerializer

    from geotrain.swarm.msgpack_guard import install_decode_guard

    install_decode_guard()
    honest = MSGPackSerializer.dumps({"x": 1}) + b"[signature:abc]"
    poison = nested_tuples(200)
    items = [[b"[owner:good]", honest, 2e9], [b"[owner:evil]", poison, 2e9]]
    raw = msgpack.packb(
        msgpack.ExtType(0x50, msgpack.packb([10, 2e9, items], use_bin_type=True)), use_bin_type=True
    )
    value = MSGPackSerializer.loads(raw)
    assert isinstance(value, DictionaryDHTValue)
    with value.freeze():
        got = dict(value.items())
    assert list(got) == [b"[owner:good]"] and got[b"[owner:good]"].value == honest
