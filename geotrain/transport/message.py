"""Messages of the data plane and their encoding into frames."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import torch

from geotrain.errors import BadTensorError, CodecError
from geotrain.transport.wire import Header, WireTensor, pack_header

#: How to choose a codec per tensor: one spec for all, a map name -> spec, or a function.
CodecChoice = Union[str, Mapping[str, str], Callable[[str, torch.Tensor], str]]


@dataclass
class Message:
    """One data-plane message.

    ``kind`` names the protocol (``"act"``, ``"grad"``, ``"ar.reduce"``, ...);
    ``tag`` is what a receiver matches on (e.g. ``(pipeline, step, microbatch)``),
    so messages may arrive in any order and wait for their reader. ``job``,
    ``plan_version`` and ``step`` let a receiver drop foreign or stale traffic.
    ``sender`` and ``nbytes`` (buffer bytes on the wire) are filled on receipt.
    """

    kind: str
    tag: tuple[str | int, ...] = ()
    job: str = ""
    plan_version: int = 0
    step: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    sender: str = ""
    nbytes: int = 0


#: The transport's own lossless format for any tensor (token ids, masks, probe payloads):
#: meta {"dtype": name, "shape": [...]}, one buffer. Float tensors normally go through a codec.
RAW = "raw"
_RAW_DTYPES: dict[str, torch.dtype] = {
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
_RAW_NAMES = {v: k for k, v in _RAW_DTYPES.items()}
_MAX_DIMS = 8


class _Raw:
    def encode(self, x: torch.Tensor) -> tuple[dict[str, Any], list[torch.Tensor]]:
        if x.dtype not in _RAW_NAMES:
            raise BadTensorError(f"raw tensors must be one of {sorted(_RAW_DTYPES)}; got {x.dtype}")
        return {"dtype": _RAW_NAMES[x.dtype], "shape": list(x.shape)}, [x.detach().cpu().contiguous()]

    def decode(self, meta: dict[str, Any], buffers: tuple[memoryview, ...]) -> torch.Tensor:
        dtype = _RAW_DTYPES.get(meta.get("dtype"))  # type: ignore[arg-type]
        shape = meta.get("shape")
        if dtype is None:
            raise BadTensorError(f"raw tensor has unknown dtype {meta.get('dtype')!r}")
        if (
            not isinstance(shape, list)
            or len(shape) > _MAX_DIMS
            or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in shape)
        ):
            raise BadTensorError("raw tensor shape must be a list of at most 8 non-negative ints")
        if len(buffers) != 1:
            raise BadTensorError(f"raw tensor needs exactly 1 buffer; got {len(buffers)}")
        numel = 1
        for d in shape:
            numel *= d
        itemsize = torch.empty((), dtype=dtype).element_size()
        if numel * itemsize != buffers[0].nbytes:
            raise BadTensorError(f"raw tensor {shape} of {meta['dtype']} needs {numel * itemsize} bytes; got {buffers[0].nbytes}")
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        # copy out of the zmq frame: the frame is read-only and is freed after this message
        return torch.frombuffer(bytearray(buffers[0]), dtype=dtype).reshape(shape)


_raw = _Raw()


@functools.lru_cache(maxsize=256)
def _codec(spec: str) -> Any:
    # Bounded cache: a hostile peer naming many distinct specs only churns it.
    from geotrain.compression import get_codec

    return get_codec(spec)


def _choose(codec: CodecChoice, name: str, tensor: torch.Tensor) -> str:
    if not tensor.is_floating_point():
        return RAW  # ids, masks: never lossy
    if isinstance(codec, str):
        return codec
    if callable(codec):
        return codec(name, tensor)
    return codec.get(name, "none")


def _bytes_view(buf: torch.Tensor) -> Any:
    """A zero-copy, byte-addressed view of a contiguous CPU tensor, for zmq."""
    buf = buf.detach()
    if buf.device.type != "cpu":
        buf = buf.cpu()
    return buf.contiguous().reshape(-1).view(torch.uint8).numpy()


def encode(msg: Message, *, sender: str, codec: CodecChoice = "none", rpc: dict[str, Any] | None = None) -> list[Any]:
    """Frames for ``msg``: the msgpack header, then each codec buffer as its own frame."""
    descriptors: list[dict[str, Any]] = []
    frames: list[Any] = []
    for name, tensor in msg.tensors.items():
        spec = _choose(codec, name, tensor)
        if spec == RAW:
            meta, buffers = _raw.encode(tensor)
        else:
            enc = _codec(spec).encode(tensor)
            spec, meta, buffers = enc.codec, enc.meta, list(enc.buffers)
        bufs = [_bytes_view(b) for b in buffers]
        descriptors.append({"name": name, "codec": spec, "meta": meta, "frames": [b.nbytes for b in bufs]})
        frames.extend(bufs)
    fields: dict[str, Any] = {
        "kind": msg.kind,
        "tag": list(msg.tag),
        "sender": sender,
        "job": msg.job,
        "plan": msg.plan_version,
        "step": msg.step,
        "meta": msg.meta,
        "tensors": descriptors,
    }
    if rpc is not None:
        fields["rpc"] = rpc
    return [pack_header(fields), *frames]


def decode(header: Header, tensors: tuple[WireTensor, ...]) -> Message:
    """Decode every tensor with its codec; a bad payload raises BadTensorError."""
    out: dict[str, torch.Tensor] = {}
    for wt in tensors:
        try:
            if wt.codec == RAW:
                out[wt.name] = _raw.decode(wt.meta, wt.buffers)
            else:
                out[wt.name] = _codec(wt.codec).decode(wt.meta, wt.buffers)
        except CodecError as e:
            raise BadTensorError(f"tensor {wt.name!r} ({wt.codec}): {e}") from None
    return Message(
        kind=header.kind,
        tag=header.tag,
        job=header.job,
        plan_version=header.plan,
        step=header.step,
        meta=header.meta,
        tensors=out,
        sender=header.sender,
        nbytes=sum(wt.nbytes for wt in tensors),
    )
