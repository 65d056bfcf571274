"""A non-recursive pre-scan of msgpack bytes, and the guard that puts it in front of hivemind.

Why: hivemind's ``MSGPackSerializer`` decodes its tuple extension type (code 0x40)
by calling ``msgpack.unpackb`` again from the ext hook, once per nesting level.
Each level costs a C unpacker context on the stack, so about 300 nested tuples
(~1.3 KB of bytes) overflow the C stack and the reading process dies with
SIGSEGV; no Python ``except`` can catch that. A DHT node decodes a
``DictionaryDHTValue`` (every record with subkeys) *before* any record
validator sees it, so a record stored on a node without validators would kill
every geotrain reader that fetched it.

:func:`scan_msgpack` walks the bytes with an explicit stack (no recursion, no
allocation driven by declared lengths) and raises :class:`RecordError` when the
nesting depth, the byte size or a declared length is out of bounds.
:func:`install_decode_guard` makes hivemind run that scan before every decode
in the process (and in DHT processes forked from it afterwards), and makes a
``DictionaryDHTValue`` drop the individual subkeys that fail it instead of
failing the whole dictionary.
"""

from __future__ import annotations

import logging
import re
import struct
import threading
from collections.abc import Callable
from typing import Any

from geotrain.errors import RecordError

logger = logging.getLogger(__name__)

TUPLE_EXT = 0x40  # hivemind's MSGPackSerializer._TUPLE_EXT_TYPE_CODE: payload is a msgpack array
DICTIONARY_EXT = 0x50  # hivemind.dht.storage.DictionaryDHTValue

#: Depth allowed by the process-wide guard. Generous for any honest hivemind
#: message (they nest a handful of levels) and far below the ~300 tuple levels
#: (about 600 counted levels) where the C stack runs out.
GUARD_MAX_DEPTH = 48

# Fixed-size payloads after the first byte, for formats that are not containers.
_FIXED = {
    0xC0: 0, 0xC2: 0, 0xC3: 0,  # nil, false, true
    0xCA: 4, 0xCB: 8,  # float32, float64
    0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,  # uint8..64
    0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8,  # int8..64
}  # fmt: skip
_LEN_PREFIXED = {  # format byte -> (size of the length field, kind)
    0xC4: (1, "bin"), 0xC5: (2, "bin"), 0xC6: (4, "bin"),
    0xD9: (1, "str"), 0xDA: (2, "str"), 0xDB: (4, "str"),
    0xC7: (1, "ext"), 0xC8: (2, "ext"), 0xC9: (4, "ext"),
    0xDC: (2, "array"), 0xDD: (4, "array"), 0xDE: (2, "map"), 0xDF: (4, "map"),
}  # fmt: skip
_FIXEXT = {0xD4: 1, 0xD5: 2, 0xD6: 4, 0xD7: 8, 0xD8: 16}
_UINT = {1: ">B", 2: ">H", 4: ">I"}


def scan_msgpack(
    buf: bytes | bytearray | memoryview,
    *,
    max_depth: int,
    max_bytes: int | None = None,
    descend_ext: frozenset[int] = frozenset({TUPLE_EXT}),
) -> int:
    """Check that ``buf`` is exactly one msgpack object within limits, without decoding it.

    Depth counts every array, map and descended extension (a hivemind tuple is
    two levels: the extension and the array inside it). Extension payloads whose
    type code is in ``descend_ext`` are scanned as nested msgpack; others are
    opaque bytes. Returns the maximum depth seen; raises :class:`RecordError`
    on any violation or malformed input.
    """
    view = memoryview(buf).cast("B") if not isinstance(buf, bytes) else buf
    n = len(view)
    if max_bytes is not None and n > max_bytes:
        raise RecordError(f"msgpack value of {n} bytes exceeds the limit of {max_bytes} bytes")
    # Each frame: [objects still expected, end offset the frame must finish at (or -1)].
    stack: list[list[int]] = [[1, n]]
    pos = 0
    deepest = 0

    def read_uint(size: int) -> int:
        nonlocal pos
        if pos + size > n:
            raise RecordError("truncated msgpack (length field past the end)")
        (value,) = struct.unpack_from(_UINT[size], view, pos)
        pos += size
        return int(value)

    while stack:
        frame = stack[-1]
        if frame[0] == 0:
            stack.pop()
            if frame[1] >= 0 and pos != frame[1]:
                if not stack:
                    raise RecordError(f"malformed msgpack ({n - pos} trailing bytes after the object)")
                raise RecordError("malformed msgpack (an object does not fill its extension payload)")
            continue
        frame[0] -= 1
        if pos >= n:
            raise RecordError("truncated msgpack (object expected past the end)")
        b = view[pos]
        pos += 1
        children = 0  # objects inside a container that starts here
        if b <= 0x7F or b >= 0xE0:
            continue  # fixint
        if 0x80 <= b <= 0x8F:
            children = 2 * (b & 0x0F)
        elif 0x90 <= b <= 0x9F:
            children = b & 0x0F
        elif 0xA0 <= b <= 0xBF:
            pos += b & 0x1F
        elif b in _FIXED:
            pos += _FIXED[b]
        elif b in _FIXEXT or b in (0xC7, 0xC8, 0xC9):
            if b in _FIXEXT:
                length = _FIXEXT[b]
            else:
                length = read_uint(_LEN_PREFIXED[b][0])
            if pos + 1 + length > n:
                raise RecordError("truncated msgpack (extension payload past the end)")
            code = view[pos]
            pos += 1
            if code in descend_ext:
                stack.append([1, pos + length])
                deepest = max(deepest, len(stack) - 1)
                if len(stack) - 1 > max_depth:
                    raise RecordError(f"msgpack value nested deeper than {max_depth} levels")
                continue
            pos += length
        elif b in _LEN_PREFIXED:
            size, kind = _LEN_PREFIXED[b]
            length = read_uint(size)
            if kind == "array":
                children = length
            elif kind == "map":
                children = 2 * length
            else:
                pos += length
        else:  # 0xC1 is the only remaining byte: never used by msgpack
            raise RecordError(f"malformed msgpack (reserved byte 0x{b:02x})")
        if pos > n:
            raise RecordError("truncated msgpack (payload past the end)")
        if children:
            # Every object takes at least one byte: a declared length beyond the
            # remaining bytes is a lie, refused before anyone allocates for it.
            if children > n - pos:
                raise RecordError("malformed msgpack (declared length exceeds the remaining bytes)")
            stack.append([children, -1])
        elif 0x80 <= b <= 0x9F or b in (0xDC, 0xDD, 0xDE, 0xDF):
            stack.append([0, -1])  # an empty container still counts as one level
        depth = len(stack) - 1
        deepest = max(deepest, depth)
        if depth > max_depth:
            raise RecordError(f"msgpack value nested deeper than {max_depth} levels")
    return deepest


# What hivemind's RSASignatureValidator appends to a signed value (and strips before decoding).
_SIGNATURE_RE = re.compile(re.escape(b"[signature:_value_]").replace(b"_value_", rb"(.+?)"))


def strip_signatures(value: bytes) -> bytes:
    """``value`` without its ``[signature:...]`` suffixes: the bytes hivemind will decode."""
    return _SIGNATURE_RE.sub(b"", value)


# -- the guard -----------------------------------------------------------------------------------
_installed = False
_install_lock = threading.Lock()
_dropped_subkeys = 0


def dropped_subkeys() -> int:
    """How many dictionary items this process dropped because they failed the scan."""
    return _dropped_subkeys


def install_decode_guard(*, max_depth: int = GUARD_MAX_DEPTH) -> None:
    """Make every hivemind msgpack decode in this process scan its input first.

    Idempotent. Call it before starting a ``hivemind.DHT``: the DHT runs in a
    forked child, which inherits the patched classes. Two patches:

    - ``MSGPackSerializer.loads`` raises :class:`RecordError` (a ValueError) for
      input that fails :func:`scan_msgpack`; hivemind's RPC handlers and its
      ``call_find`` treat that like any bad response, and the process lives.
    - ``DictionaryDHTValue.unpackb`` decodes its items one at a time and drops
      each item whose subkey or value fails the scan, so one poisoned subkey does
      not hide the honest subkeys stored next to it.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        from hivemind.dht.storage import DictionaryDHTValue
        from hivemind.utils.serializer import MSGPackSerializer

        original_loads: Callable[[bytes], Any] = MSGPackSerializer.loads

        def guarded_loads(cls: type, buf: bytes) -> Any:
            scan_msgpack(buf, max_depth=max_depth)
            return original_loads(buf)

        def guarded_unpackb(cls: type, raw: bytes) -> Any:
            return _unpack_dictionary(cls, raw, max_depth=max_depth)

        MSGPackSerializer.loads = classmethod(guarded_loads)
        DictionaryDHTValue.unpackb = classmethod(guarded_unpackb)
        _installed = True
        logger.debug("hivemind msgpack decode guard installed (max depth %d)", max_depth)


def _unpack_dictionary(cls: Any, raw: bytes, *, max_depth: int) -> Any:
    """Item-wise replacement of ``DictionaryDHTValue.unpackb`` (same wire format).

    The payload is ``[maxsize, latest_expiration_time, [[subkey, value_bytes, expiration], ...]]``.
    """
    import msgpack
    from hivemind.utils.serializer import MSGPackSerializer

    global _dropped_subkeys
    # Scan the envelope without descending into anything: items are checked one by one below.
    scan_msgpack(raw, max_depth=max_depth, descend_ext=frozenset())
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(raw)
    try:
        if unpacker.read_array_header() != 3:
            raise RecordError("malformed DictionaryDHTValue (expected 3 fields)")
        maxsize = unpacker.unpack()
        latest_expiration_time = unpacker.unpack()
        count = unpacker.read_array_header()
        spans = []
        for _ in range(count):
            start = unpacker.tell()
            unpacker.skip()
            spans.append((start, unpacker.tell()))
    except (msgpack.OutOfData, msgpack.ExtraData, ValueError, TypeError) as e:
        raise RecordError(f"malformed DictionaryDHTValue: {e}") from e
    if not isinstance(maxsize, (int, float)) or not isinstance(latest_expiration_time, (int, float)):
        raise RecordError("malformed DictionaryDHTValue (maxsize/expiration are not numbers)")

    with cls(maxsize).freeze() as new_dict:
        for start, stop in spans:
            try:
                item = MSGPackSerializer.loads(raw[start:stop])  # guarded: scans the subkey
                key, value, expiration_time = item
                if not isinstance(value, bytes) or not isinstance(expiration_time, (int, float)):
                    raise RecordError("malformed DictionaryDHTValue item")
                # decoded later (after validation), without the signature suffix
                scan_msgpack(strip_signatures(value), max_depth=max_depth)
                new_dict.store(key, value, expiration_time)
            except (RecordError, ValueError, TypeError) as e:
                _dropped_subkeys += 1
                logger.warning("dropped a DHT dictionary item that failed the msgpack guard: %s", e)
        new_dict.latest_expiration_time = latest_expiration_time
        return new_dict
