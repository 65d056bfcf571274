"""Nominal sizes of the compression library's codecs, without importing torch.

The planner must stay pure (no torch), so it keeps this small table instead of
asking ``geotrain.compression`` to encode anything; a test checks it against
the library's ``Codec.estimate_ratio``. Specs follow the registry's syntax:
``name`` or ``name:key=value[,key=value]``, e.g. ``"int8"``,
``"int8:block=64"``, ``"topk:fraction=0.01"``; defaults are the library's.

Encoded bytes per input element (``d`` = input bytes per element, ``c`` =
scale bytes, 2 for bf16/fp16 scales, 4 for fp32):

===========  ==================================================  ==============
codec        bytes per element                                   from fp32
===========  ==================================================  ==============
none         ``d``                                               1
fp16, bf16   ``2``                                               2
int8         ``1 + c / block`` (block 256, bf16 scales)          ~3.97
int4         ``0.5 + c / block`` (block 128, bf16 scales)        ~7.8
topk         ``(k (2 + v) + 4 [int8 values]) / chunk``, with     ~130 at 1%
             ``k = round(fraction * chunk)``, uint16 indices,
             ``v`` value bytes (int8: 1 plus an fp32 scale per
             chunk; fp16/bf16: 2), chunk 4096
===========  ==================================================  ==============

A codec never makes a tensor larger than it was: the ratio is capped below
at 1 (fp16 on bf16 activations sends them as they are).
"""

from __future__ import annotations

from geotrain.errors import ConfigError

KNOWN_CODECS = ("none", "fp16", "bf16", "int8", "int4", "topk")
_DEFAULT_BLOCK = {"int8": 256, "int4": 128}
_SCALE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_TEXT_PARAMS = ("scale", "values", "grid")


def _parse(spec: str) -> tuple[str, dict[str, float | str]]:
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"codec spec must be a non-empty string like 'int8'; got {spec!r}")
    name, _, rest = spec.partition(":")
    name = name.strip().lower()
    if name not in KNOWN_CODECS:
        raise ConfigError(f"unknown codec {spec!r}; use one of {', '.join(KNOWN_CODECS)}")
    params: dict[str, float | str] = {}
    if rest:
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq:
                raise ConfigError(f"codec spec {spec!r}: parameters are key=value, e.g. 'topk:fraction=0.01'")
            if key in _TEXT_PARAMS:
                params[key] = value.strip()
                continue
            try:
                params[key] = float(value)
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
        block = float(params.get("block", _DEFAULT_BLOCK[name]))
        scale = params.get("scale", "bf16")
        if block < 1 or scale not in _SCALE_BYTES:
            raise ConfigError(f"codec spec {spec!r}: block must be >= 1 and scale one of {sorted(_SCALE_BYTES)}")
        out = (1.0 if name == "int8" else 0.5) + _SCALE_BYTES[str(scale)] / block
    else:  # topk
        fraction = float(params.get("fraction", 0.01))
        chunk = float(params.get("chunk", 4096))
        values = params.get("values", "int8")
        if not 0.0 < fraction <= 0.5 or chunk < 1 or values not in ("int8", "fp16", "bf16"):
            raise ConfigError(
                f"codec spec {spec!r}: fraction must be in (0, 0.5], chunk >= 1, values int8/fp16/bf16; "
                "e.g. 'topk:fraction=0.01'"
            )
        kept = max(1.0, round(fraction * chunk))
        out = (kept * (2.0 + (1.0 if values == "int8" else 2.0)) + (4.0 if values == "int8" else 0.0)) / chunk
    return min(out, d)


def compression_ratio(spec: str, dtype_bytes: int) -> float:
    """Input bytes / encoded bytes for codec ``spec`` on ``dtype_bytes``-byte input (>= 1)."""
    return dtype_bytes / encoded_bytes_per_element(spec, dtype_bytes)


def validate_codec(spec: str) -> str:
    """Return ``spec`` if the table knows it; raise :class:`ConfigError` otherwise."""
    encoded_bytes_per_element(spec, 4)
    return spec
