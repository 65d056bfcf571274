"""The wire format of the data plane, and its validation.

A message is a ZMQ multipart message::

    frame 0      msgpack header (a map, at most ``limits.max_header_bytes``)
    frame 1..n   raw buffers, one per codec buffer, in header order

The header::

    {"v": 1, "kind": str, "tag": [str|int, ...], "sender": str, "job": str,
     "plan": int, "step": int, "meta": {...},
     "tensors": [{"name": str, "codec": str, "meta": {...}, "frames": [nbytes, ...]}, ...],
     "rpc": {"id": str, "reply": bool}}            # optional, request/response only

Nothing is ever unpickled. The header is decoded with explicit msgpack limits
(string, array, map lengths; extension types refused), then checked field by
field; declared frame lengths must equal the real ones. Tensor payloads are
decoded later by their codec, which validates its own meta before allocating.
All checks raise :class:`~geotrain.errors.ProtocolError` subclasses.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from geotrain.errors import BadTensorError, FrameTooLargeError, ProtocolError
from geotrain.transport.config import Limits

VERSION = 1
MAX_META_DEPTH = 8
_NAME = re.compile(r"^[A-Za-z0-9_.:=,\-/\[\]]{1,128}$")


@dataclass(frozen=True)
class WireTensor:
    """One tensor as it arrived: codec spec, codec meta and its raw buffers (not yet decoded)."""

    name: str
    codec: str
    meta: dict[str, Any]
    buffers: tuple[memoryview, ...]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)


@dataclass(frozen=True)
class Header:
    kind: str
    tag: tuple[str | int, ...]
    sender: str
    job: str
    plan: int
    step: int
    meta: dict[str, Any]
    tensors: tuple[dict[str, Any], ...]
    rpc: dict[str, Any] | None


def pack_header(fields: dict[str, Any]) -> bytes:
    return msgpack.packb({"v": VERSION, **fields}, use_bin_type=True)


def _check_depth(value: Any, *, limit: int = MAX_META_DEPTH) -> None:
    """Iterative depth check: a deep structure must not recurse in our code either."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise ProtocolError(f"header meta nested deeper than {limit} levels")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def _str(h: dict[str, Any], key: str, limits: Limits, *, pattern: bool = False) -> str:
    value = h.get(key, "")
    if not isinstance(value, str) or len(value) > limits.max_str_len:
        raise ProtocolError(f"header field {key!r} must be a string of at most {limits.max_str_len} chars")
    if pattern and value and not _NAME.match(value):
        raise ProtocolError(f"header field {key!r} has characters outside [A-Za-z0-9_.:=,-/]")
    return value


def _int(h: dict[str, Any], key: str) -> int:
    value = h.get(key, 0)
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**62) < value < 2**62:
        raise ProtocolError(f"header field {key!r} must be an integer")
    return value


def unpack_header(raw: bytes | memoryview, limits: Limits) -> Header:
    """Decode and check a header frame; raise ProtocolError on anything off."""
    if len(raw) > limits.max_header_bytes:
        raise FrameTooLargeError(f"header of {len(raw)} bytes exceeds the {limits.max_header_bytes}-byte limit")
    try:
        h = msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_str_len,
            max_array_len=limits.max_container_len,
            max_map_len=limits.max_container_len,
            max_ext_len=0,
        )
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise ProtocolError(f"header is not valid msgpack within limits: {type(e).__name__}: {e}") from None
    if not isinstance(h, dict):
        raise ProtocolError("header must be a msgpack map")
    if h.get("v") != VERSION:
        raise ProtocolError(f"unsupported wire version {h.get('v')!r}; this peer speaks {VERSION}")
    kind = _str(h, "kind", limits, pattern=True)
    if not kind:
        raise ProtocolError("header field 'kind' is empty")
    tag = h.get("tag", [])
    if not isinstance(tag, list) or len(tag) > limits.max_tag_len:
        raise ProtocolError(f"header field 'tag' must be a list of at most {limits.max_tag_len} items")
    for item in tag:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise ProtocolError("header 'tag' items must be strings or integers")
    meta = h.get("meta", {})
    if not isinstance(meta, dict):
        raise ProtocolError("header field 'meta' must be a map")
    _check_depth(meta)
    tensors = h.get("tensors", [])
    if not isinstance(tensors, list) or len(tensors) > limits.max_tensors:
        raise ProtocolError(f"header field 'tensors' must be a list of at most {limits.max_tensors}")
    for t in tensors:
        if not isinstance(t, dict):
            raise BadTensorError("tensor descriptor must be a map")
        if not isinstance(t.get("name"), str) or not isinstance(t.get("codec"), str):
            raise BadTensorError("tensor descriptor needs string 'name' and 'codec'")
        if not _NAME.match(t["codec"]):
            raise BadTensorError(f"tensor codec spec {t['codec'][:40]!r} is malformed")
        if not isinstance(t.get("meta", {}), dict):
            raise BadTensorError("tensor descriptor 'meta' must be a map")
        _check_depth(t.get("meta", {}))
        frames = t.get("frames")
        if not isinstance(frames, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= limits.max_frame_bytes for n in frames
        ):
            raise BadTensorError("tensor descriptor 'frames' must list non-negative byte lengths within limits")
    rpc = h.get("rpc")
    if rpc is not None and (not isinstance(rpc, dict) or not isinstance(rpc.get("id"), str)):
        raise ProtocolError("header field 'rpc' must be a map with a string 'id'")
    return Header(
        kind=kind,
        tag=tuple(tag),
        sender=_str(h, "sender", limits),
        job=_str(h, "job", limits),
        plan=_int(h, "plan"),
        step=_int(h, "step"),
        meta=meta,
        tensors=tuple(tensors),
        rpc=rpc,
    )


def split_tensors(header: Header, buffers: Sequence[memoryview], limits: Limits) -> tuple[WireTensor, ...]:
    """Match declared frame lengths against the real buffers; no byte is copied."""
    declared = [n for t in header.tensors for n in t["frames"]]
    if len(declared) != len(buffers):
        raise BadTensorError(f"header declares {len(declared)} buffer frames; message carries {len(buffers)}")
    total = 0
    for i, (want, buf) in enumerate(zip(declared, buffers, strict=True)):
        if buf.nbytes != want:
            raise BadTensorError(f"frame {i + 1} has {buf.nbytes} bytes; header declares {want}")
        total += want
    if total > limits.max_message_bytes:
        raise FrameTooLargeError(f"message of {total} bytes exceeds the {limits.max_message_bytes}-byte limit")
    out: list[WireTensor] = []
    pos = 0
    for t in header.tensors:
        n = len(t["frames"])
        out.append(WireTensor(t["name"], t["codec"], t.get("meta", {}), tuple(buffers[pos : pos + n])))
        pos += n
    return tuple(out)


def check_frame_count(nframes: int, limits: Limits) -> None:
    if nframes < 1:
        raise ProtocolError("empty message")
    if nframes > limits.max_frames + 1:
        raise FrameTooLargeError(f"message has {nframes} frames; the limit is {limits.max_frames + 1}")
