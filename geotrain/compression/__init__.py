"""Tensor compression for geotrain: codecs behind one small interface, error feedback, policies.

Importing this package registers the built-in codecs (see ``registered_codecs()``).
No networking here: codecs map tensors to ``Encoded`` (meta dict + raw buffers) and back.
"""

from __future__ import annotations

from geotrain.compression import cast as _cast  # noqa: F401  (registers none/fp16/bf16)
from geotrain.compression import int4 as _int4  # noqa: F401
from geotrain.compression import int8 as _int8  # noqa: F401
from geotrain.compression import topk as _topk  # noqa: F401
from geotrain.compression.base import (
    Codec,
    Encoded,
    decode,
    get_codec,
    parse_spec,
    register_codec,
    registered_codecs,
)

__all__ = [
    "Codec",
    "Encoded",
    "decode",
    "get_codec",
    "parse_spec",
    "register_codec",
    "registered_codecs",
]
