"""Tensor compression for geotrain: codecs behind one small interface, error feedback, policies.

Importing this package registers the built-in codecs (``registered_codecs()``):
``none``, ``fp16``, ``bf16``, ``int8``, ``int4``, ``topk`` and the bridged
``hivemind-*`` codecs. No networking here: a codec maps a tensor to an
``Encoded`` (msgpack-able meta + raw buffers) and back. See docs/compression.md.
"""

from __future__ import annotations

from geotrain.compression import cast as _cast  # noqa: F401  (each module registers its codecs)
from geotrain.compression import hivemind_bridge as _hivemind_bridge  # noqa: F401
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
from geotrain.compression.feedback import ErrorFeedback, ErrorFeedbackConfig, ErrorFeedbackState
from geotrain.compression.hivemind_bridge import HivemindCodec, to_hivemind
from geotrain.compression.policy import (
    ByRole,
    BySize,
    Fixed,
    Policy,
    Role,
    TensorInfo,
    default_policy,
    policy_from_config,
)

__all__ = [
    "ByRole",
    "BySize",
    "Codec",
    "Encoded",
    "ErrorFeedback",
    "ErrorFeedbackConfig",
    "ErrorFeedbackState",
    "Fixed",
    "HivemindCodec",
    "Policy",
    "Role",
    "TensorInfo",
    "decode",
    "default_policy",
    "get_codec",
    "parse_spec",
    "policy_from_config",
    "register_codec",
    "registered_codecs",
    "to_hivemind",
]
