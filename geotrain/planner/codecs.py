"""Nominal sizes of the compression library's codecs, without importing torch.

The planner must stay pure (no torch), so it keeps this small table instead of
asking ``geotrain.compression`` to encode anything. Specs follow the
compression registry's syntax: ``name`` or ``name:key=value[,key=value]``,
e.g. ``"int8"``, ``"int8:block=64"``, ``"topk:fraction=0.01"``.

Encoded bytes per input element (``d`` = input bytes per element):

===========  =============================================  ==================
codec        bytes per element                              ratio from fp32
===========  =============================================  ==================
none         ``d``                                          1
fp16, bf16   ``2``                                          2
int8         ``1 + 2 / block`` (fp16 scale per block, 64)   ~3.9
int4         ``0.5 + 2 / block`` (block 64)                 ~7.5
topk         ``fraction * (min(d, 4) + 4)`` (value + int32  ~50 at 1%
             index per kept element)
===========  =============================================  ==================

A codec never makes a tensor larger than it was: the ratio is capped below
at 1 (fp16 on bf16 activations sends them as they are).
"""

from __future__ import annotations

from geotrain.errors import ConfigError

KNOWN_CODECS = ("none", "fp16", "bf16", "int8", "int4", "topk")
_DEFAULT_BLOCK = 64


def _parse(spec: str) -> tuple[str, dict[str, float]]:
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"codec spec must be a non-empty string like 'int8'; got {spec!r}")
    name, _, rest = spec.partition(":")
    name = name.strip().lower()
    if name not in KNOWN_CODECS:
        raise ConfigError(f"unknown codec {spec!r}; use one of {', '.join(KNOWN_CODECS)}")
    params: dict[str, float] = {}
    if rest:
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            if not eq:
                raise ConfigError(f"codec spec {spec!r}: parameters are key=value, e.g. 'topk:fraction=0.01'")
            try:
                params[key.strip()] = float(value)
            except ValueError:
                raise ConfigError(f"codec spec {spec!r}: {key.strip()} must be a number") from None
    return name, params


def encoded_bytes_per_element(spec: str, dtype_bytes: int) -> float:
    """Bytes on the wire per input element of ``dtype_bytes`` bytes, for codec ``spec``."""
    name, params = _parse(spec)
    d = float(dtype_bytes)
    if name == "none":
        out = d
    elif name in ("fp16", "bf16"):
        out = 2.0
    elif name in ("int8", "int4"):
        block = params.get("block", _DEFAULT_BLOCK)
        if block < 1:
            raise ConfigError(f"codec spec {spec!r}: block must be >= 1")
        out = (1.0 if name == "int8" else 0.5) + 2.0 / block
    else:  # topk
        fraction = params.get("fraction", 0.01)
        if not 0.0 < fraction <= 1.0:
            raise ConfigError(f"codec spec {spec!r}: fraction must be in (0, 1]; e.g. 'topk:fraction=0.01'")
        out = fraction * (min(d, 4.0) + 4.0)
    return min(out, d)


def compression_ratio(spec: str, dtype_bytes: int) -> float:
    """Input bytes / encoded bytes for codec ``spec`` on ``dtype_bytes``-byte input (>= 1)."""
    return dtype_bytes / encoded_bytes_per_element(spec, dtype_bytes)


def validate_codec(spec: str) -> str:
    """Return ``spec`` if the table knows it; raise :class:`ConfigError` otherwise."""
    encoded_bytes_per_element(spec, 4)
    return spec
