"""Configuration of the ZMQ data plane: addresses, limits, timeouts."""

from __future__ import annotations

from dataclasses import dataclass, field

from geotrain.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
#: most TCP connections per peer (``TransportConfig.streams``), and parts per striped message
MAX_STREAMS = 16


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one inbound message may be. Every check runs before a buffer is allocated.

    The defaults admit a 1B-parameter stage's pseudo-gradient in fp32 split over
    a few frames, and nothing near the machine's memory.
    """

    max_header_bytes: int = 64 * KiB
    max_frames: int = 1024
    max_frame_bytes: int = 1 * GiB  # also set as ZMQ_MAXMSGSIZE: zmq drops the connection beyond it
    max_message_bytes: int = 4 * GiB
    max_tensors: int = 512
    max_str_len: int = 4 * KiB
    max_container_len: int = 4096  # any msgpack array or map in a header
    max_tag_len: int = 16
    max_buffered_bytes: int = 2 * GiB  # unclaimed messages held for later recv(); oldest dropped beyond

    def __post_init__(self) -> None:
        for name in (
            "max_header_bytes",
            "max_frames",
            "max_frame_bytes",
            "max_message_bytes",
            "max_tensors",
            "max_str_len",
            "max_container_len",
            "max_tag_len",
            "max_buffered_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"transport.limits.{name} must be > 0; got {getattr(self, name)}")
        if self.max_frame_bytes > self.max_message_bytes:
            raise ConfigError("transport.limits.max_frame_bytes must be <= max_message_bytes")


@dataclass(frozen=True, kw_only=True)
class CurveConfig:
    """CURVE keys (z85 text) for an authenticated, encrypted data plane.

    ``public_key``/``secret_key`` are this peer's; ``allowed_clients`` is the ZAP
    allow-list of client public keys (the swarm's members). An empty allow-list
    refuses everyone, which is safer than accepting anyone.
    """

    public_key: bytes
    secret_key: bytes
    allowed_clients: frozenset[bytes] = frozenset()

    def __post_init__(self) -> None:
        for name in ("public_key", "secret_key"):
            if len(getattr(self, name)) != 40:
                raise ConfigError(f"transport.curve.{name} must be a 40-character z85 key (geotrain keygen)")


@dataclass(frozen=True, kw_only=True)
class TransportConfig:
    """The data plane of one peer.

    ``host``/``port``: where the inbox binds (port 0 = any free port; read the
    real address back from :attr:`Transport.bound_address`).
    ``announce``: what the peer publishes instead of the bound address, as
    ``HOST`` or ``HOST:PORT`` items (:func:`geotrain.transport.addresses.parse_announce`);
    empty = the bound address, or the interfaces' addresses when bound to ``0.0.0.0``/``::``.
    ``dial_out``: this peer accepts no inbound connections (behind NAT): it publishes
    :data:`~geotrain.transport.addresses.DIAL_BACK`, dials out to every peer it exchanges
    with and says hello every ``keepalive_s`` so they answer over that connection.
    ``streams``: TCP connections to each peer in another region (both regions named and different); a
    message of ``stripe_min_bytes`` or more is split over them (:mod:`geotrain.transport.stripes`), so one
    window-limited connection does not cap a long fat link. Peers in the same region, dial-back and relayed
    peers get one connection.
    """

    host: str = "127.0.0.1"
    port: int = 0
    announce: tuple[str, ...] = ()
    dial_out: bool = False
    keepalive_s: float = 5.0
    limits: Limits = field(default_factory=Limits)
    send_timeout_s: float = 30.0
    recv_timeout_s: float = 30.0
    linger_s: float = 1.0
    sndhwm: int = 64  # messages queued per destination before send() waits
    handler_threads: int = 2
    curve: CurveConfig | None = None
    streams: int = 4
    stripe_min_bytes: int = 1 * MiB

    def __post_init__(self) -> None:
        if not self.host:
            raise ConfigError("transport.host must be an address such as 127.0.0.1")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"transport.port must be in 0..65535 (0 = any free port); got {self.port}")
        for name in ("send_timeout_s", "recv_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"transport.{name} must be > 0; got {getattr(self, name)}")
        if isinstance(self.announce, str) or not all(isinstance(a, str) and a for a in self.announce):
            raise ConfigError("transport.announce must be a tuple of HOST or HOST:PORT strings")
        if self.keepalive_s <= 0:
            raise ConfigError(f"transport.keepalive_s must be > 0; got {self.keepalive_s}")
        if self.sndhwm <= 0 or self.handler_threads <= 0:
            raise ConfigError("transport.sndhwm and transport.handler_threads must be > 0")
        if not 1 <= self.streams <= MAX_STREAMS:
            raise ConfigError(f"transport.streams must be in 1..{MAX_STREAMS} (connections per peer in another region); "
                              f"got {self.streams}")
        if self.stripe_min_bytes < 1:
            raise ConfigError(f"transport.stripe_min_bytes must be >= 1; got {self.stripe_min_bytes}")
