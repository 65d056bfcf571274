"""The data plane: ZMQ sockets, msgpack headers + raw tensor frames, limits, CURVE.

See :mod:`geotrain.transport.endpoint` for the threading model and
:mod:`geotrain.transport.wire` for the wire format.
"""

from geotrain.transport.config import CurveConfig, Limits, TransportConfig
from geotrain.transport.endpoint import LinkEmulator, Transport, TransportStats
from geotrain.transport.message import CodecChoice, Message

__all__ = [
    "CodecChoice",
    "CurveConfig",
    "Limits",
    "LinkEmulator",
    "Message",
    "Transport",
    "TransportConfig",
    "TransportStats",
]
