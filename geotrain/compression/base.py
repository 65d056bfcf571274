"""The codec seam: one small interface for every tensor compression scheme.

A **codec** turns a tensor into an :class:`Encoded` (a msgpack-able ``meta``
dict plus raw buffers, each sent as one ZMQ frame) and back. The same codecs
serve activations on pipeline hops and pseudo-gradients in DiLoCo rounds.

A **spec** names a codec and its options in one string, ``name[:key=value,...]``
(``"int8"``, ``"int8:block=64"``, ``"topk:fraction=0.01"``). ``Encoded.codec``
holds the canonical spec of the codec that made it, so a receiver can rebuild
the decoder with :func:`get_codec` from the header alone.

Decoders take buffers straight off the wire (possibly read-only memoryviews
from untrusted peers) and validate ``meta`` and every byte length *before*
allocating the output; any inconsistency raises :class:`CodecError`.
"""

from __future__ import annotations

import abc
import math
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from geotrain.errors import CodecError, ConfigError, NonFiniteError

__all__ = [
    "Buffer",
    "Codec",
    "Encoded",
    "MAX_DIMS",
    "MAX_NUMEL",
    "decode",
    "get_codec",
    "parse_spec",
    "register_codec",
    "registered_codecs",
]

Buffer = memoryview | bytes | bytearray | torch.Tensor

#: Largest tensor a decoder will allocate (2**31 elements = 8 GiB of fp32).
MAX_NUMEL = 1 << 31
#: Most dimensions a decoded tensor may have.
MAX_DIMS = 16

#: dtypes a codec accepts as input and restores on decode, by their wire name.
FLOAT_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_DTYPE_NAMES = {v: k for k, v in FLOAT_DTYPES.items()}


@dataclass(frozen=True)
class Encoded:
    """One encoded tensor: what crosses the wire.

    ``codec`` is the spec that decodes it; ``meta`` is msgpack-able and always
    holds ``"shape"`` and ``"dtype"``; each of ``buffers`` is a contiguous CPU
    tensor sent as one raw frame.
    """

    codec: str
    meta: dict[str, Any]
    buffers: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of payload (buffers only; the header is not counted)."""
        return sum(b.numel() * b.element_size() for b in self.buffers)


class Codec(abc.ABC):
    """A tensor compression scheme: ``encode``, ``decode``, ``estimate_ratio``.

    Subclasses set ``name`` (the registry name) and implement ``spec`` so that
    ``get_codec(codec.spec)`` rebuilds an equivalent codec.
    """

    name: str = "?"

    @property
    def spec(self) -> str:
        """Canonical spec string; default: the bare name (codecs with options override)."""
        return self.name

    @property
    def lossless(self) -> bool:
        """True when decode(encode(x)) == x bit for bit (only ``none``)."""
        return False

    @abc.abstractmethod
    def encode(self, x: torch.Tensor) -> Encoded:
        """Compress ``x`` (fp32/bf16/fp16, any shape, any device) into an :class:`Encoded`."""

    @abc.abstractmethod
    def decode(self, meta: Mapping[str, Any], buffers: Sequence[Buffer]) -> torch.Tensor:
        """Rebuild the tensor (original shape and dtype, CPU); raise CodecError on bad input."""

    @abc.abstractmethod
    def estimate_ratio(self, numel: int, dtype: torch.dtype) -> float:
        """Input bytes / encoded bytes for a tensor of ``numel`` elements, without encoding."""

    def __repr__(self) -> str:
        return f"<codec {self.spec}>"


# -- registry ----------------------------------------------------------------------------------
_REGISTRY: dict[str, Callable[..., Codec]] = {}
_CACHE: dict[str, Codec] = {}
_LOCK = threading.Lock()


def register_codec(name: str, factory: Callable[..., Codec]) -> None:
    """Make ``factory(**options)`` reachable as spec ``name[:options]``; names are unique."""
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise CodecError(f"codec name must be alphanumeric (with - or _); got {name!r}")
    with _LOCK:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise CodecError(f"codec {name!r} is already registered; pick another name")
        _REGISTRY[name] = factory


def registered_codecs() -> list[str]:
    """Names of every registered codec, sorted."""
    with _LOCK:
        return sorted(_REGISTRY)


def _parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """Split ``"name:k=v,k2=v2"`` into ``("name", {"k": v, "k2": v2})`` (ints, floats, bools parsed)."""
    if not isinstance(spec, str) or not spec.strip():
        raise CodecError(f"codec spec must be a non-empty string like 'int8:block=64'; got {spec!r}")
    name, _, rest = spec.strip().partition(":")
    options: dict[str, Any] = {}
    if rest:
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            if not eq or not key.strip() or not value.strip():
                raise CodecError(f"codec option {item!r} in {spec!r} must look like key=value")
            if key.strip() in options:
                raise CodecError(f"codec option {key.strip()!r} given twice in {spec!r}")
            options[key.strip()] = _parse_value(value.strip())
    return name, options


def get_codec(spec: str) -> Codec:
    """Build (or reuse) the codec a spec names; unknown names or options raise CodecError."""
    with _LOCK:
        cached = _CACHE.get(spec)
    if cached is not None:
        return cached
    name, options = parse_spec(spec)
    with _LOCK:
        factory = _REGISTRY.get(name)
    if factory is None:
        raise CodecError(f"unknown codec {name!r}; registered: {', '.join(registered_codecs())}")
    try:
        codec = factory(**options)
    except TypeError as exc:  # an option the codec's config does not have
        raise CodecError(f"bad options for codec {name!r} in {spec!r}: {exc}") from exc
    except ConfigError as exc:  # an option out of range; specs arrive from peers, so one error type
        raise CodecError(f"bad options for codec {name!r} in {spec!r}: {exc}") from exc
    with _LOCK:
        if len(_CACHE) < 1024:  # specs come from peers: never grow without bound
            _CACHE[spec] = codec
    return codec


def decode(encoded_codec_spec: str, meta: Mapping[str, Any], buffers: Sequence[Buffer]) -> torch.Tensor:
    """Convenience: ``get_codec(spec).decode(meta, buffers)``."""
    return get_codec(encoded_codec_spec).decode(meta, buffers)


# -- helpers shared by codecs --------------------------------------------------------------------
def dtype_name(dtype: torch.dtype) -> str:
    """Wire name of an input dtype; other dtypes raise CodecError."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        raise CodecError(f"codecs take float32/float16/bfloat16 tensors; got {dtype}")
    return name


def check_input(x: torch.Tensor) -> torch.Tensor:
    """Validate an encode input and return it as a contiguous CPU tensor (no copy when already so)."""
    if not isinstance(x, torch.Tensor):
        raise CodecError(f"encode takes a torch.Tensor; got {type(x).__name__}")
    dtype_name(x.dtype)
    if x.requires_grad:
        x = x.detach()
    return x.to("cpu").contiguous()


def raise_nonfinite(codec: str) -> None:
    raise NonFiniteError(
        f"codec {codec!r} got NaN/Inf input; find the source (loss scale, lr) or use a policy "
        "that allows non-finite values for 'none'/'fp16'"
    )


def read_header(meta: Mapping[str, Any], *, codec: str, nbuffers: int, buffers: Sequence[Buffer]
                ) -> tuple[tuple[int, ...], torch.dtype, int]:
    """Validate the common header fields; returns (shape, dtype, numel)."""
    if not isinstance(meta, Mapping):
        raise CodecError(f"{codec}: meta must be a mapping; got {type(meta).__name__}")
    shape_raw = meta.get("shape")
    if not isinstance(shape_raw, list | tuple) or len(shape_raw) > MAX_DIMS:
        raise CodecError(f"{codec}: meta['shape'] must be a list of at most {MAX_DIMS} ints")
    shape: list[int] = []
    for dim in shape_raw:
        if type(dim) is not int or dim < 0:
            raise CodecError(f"{codec}: shape dims must be non-negative ints; got {shape_raw!r}")
        shape.append(dim)
    numel = math.prod(shape)
    if numel > MAX_NUMEL:
        raise CodecError(f"{codec}: tensor of {numel} elements exceeds the cap of {MAX_NUMEL}")
    dtype_raw = meta.get("dtype")
    dtype = FLOAT_DTYPES.get(dtype_raw) if isinstance(dtype_raw, str) else None
    if dtype is None:
        raise CodecError(f"{codec}: meta['dtype'] must be one of {sorted(FLOAT_DTYPES)}; got {meta.get('dtype')!r}")
    if not isinstance(buffers, Sequence) or len(buffers) != nbuffers:
        got = len(buffers) if isinstance(buffers, Sequence) else type(buffers).__name__
        raise CodecError(f"{codec}: expected {nbuffers} buffers; got {got}")
    return tuple(shape), dtype, numel


def meta_int(meta: Mapping[str, Any], key: str, *, codec: str, lo: int, hi: int) -> int:
    """An int field of ``meta`` within [lo, hi], else CodecError."""
    value = meta.get(key)
    if type(value) is not int or not lo <= value <= hi:
        raise CodecError(f"{codec}: meta[{key!r}] must be an int in [{lo}, {hi}]; got {value!r}")
    return value


def buffer_nbytes(buf: Buffer) -> int:
    if isinstance(buf, torch.Tensor):
        return buf.numel() * buf.element_size()
    if isinstance(buf, memoryview):
        return buf.nbytes
    if isinstance(buf, bytes | bytearray):
        return len(buf)
    raise CodecError(f"buffers must be bytes, bytearray, memoryview or tensor; got {type(buf).__name__}")


def view_buffer(buf: Buffer, dtype: torch.dtype, count: int, *, codec: str, what: str) -> torch.Tensor:
    """A 1-D tensor of ``count`` ``dtype`` items over ``buf`` after an exact length check.

    No copy is made: the result aliases the buffer, so decoders must only read it.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    expected = count * itemsize
    got = buffer_nbytes(buf)
    if got != expected:
        raise CodecError(f"{codec}: {what} buffer has {got} bytes; expected exactly {expected}")
    if count == 0:
        return torch.empty(0, dtype=dtype)
    if isinstance(buf, torch.Tensor):
        flat = buf.detach().reshape(-1)
        if flat.device.type != "cpu":
            flat = flat.cpu()
        raw = flat.contiguous().view(torch.uint8)
        if raw.storage_offset() % itemsize:  # a misaligned slice cannot be reinterpreted in place
            raw = raw.clone()
        return raw.view(dtype)
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if not mv.c_contiguous:
        raise CodecError(f"{codec}: {what} buffer must be contiguous")
    mv = mv.cast("B")
    if mv.readonly:
        # torch has no read-only tensors and warns; we never write through this view, and a
        # copy would double the memory of a large frame, so silence that one warning here.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)
            return torch.frombuffer(mv, dtype=torch.uint8).view(dtype)
    return torch.frombuffer(mv, dtype=torch.uint8).view(dtype)
