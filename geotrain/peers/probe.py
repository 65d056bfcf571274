"""Link probes over the data plane: round-trip time and bulk bandwidth to another peer.

RTT is the median of small request/response pings. Bandwidth is measured by
bulk requests that grow (at least doubling, or straight to the size the
last one predicts) until one takes long enough to be meaningful
(``min_transfer_s``) or reaches ``max_bytes`` (1.5 MiB: a probe of one link
moves at most about 3.3 MiB, on loopback too); a transfer's time
minus one RTT is its serialisation time, and the median over ``rounds``
transfers of that size is reported. On loopback these are real loopback
numbers; under emulation or tbf shaping they are the emulated link's.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass

import torch

from geotrain.errors import ConfigError, GeotrainError
from geotrain.transport import Message, Transport

PING = "probe.ping"
BULK = "probe.bulk"


@dataclass(frozen=True, kw_only=True)
class ProbeConfig:
    pings: int = 7
    start_bytes: int = 256 << 10
    max_bytes: int = 3 << 19  # 1.5 MiB
    min_transfer_s: float = 0.05
    rounds: int = 2
    ping_timeout_s: float = 3.0  # a peer that does not answer a ping this fast is skipped until the next round
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.pings < 1 or self.rounds < 1:
            raise ConfigError("probe.pings and probe.rounds must be >= 1")
        if not 0 < self.start_bytes <= self.max_bytes:
            raise ConfigError("probe.start_bytes must be > 0 and <= probe.max_bytes")


@dataclass(frozen=True)
class LinkMeasurement:
    """One direction's measured link: ``bandwidth_bps`` in bytes/s, ``rtt_s`` in seconds."""

    src: str
    dst: str
    bandwidth_bps: float
    rtt_s: float
    measured_at: float
    probe_bytes: int


def serve_probes(transport: Transport) -> None:
    """Answer other peers' probes on this transport: pings, bulk transfers and reachability dial-backs."""
    from geotrain.peers.reachability import serve_dialback

    transport.serve(PING, lambda m: Message(kind=PING + ".ok"))
    transport.serve(BULK, lambda m: Message(kind=BULK + ".ok", meta={"n": m.nbytes}))
    serve_dialback(transport)


def answering(transport: Transport, peers: set[str], *, timeout: float) -> set[str]:
    """The peers of ``peers`` that answer a ping within ``timeout`` (all asked at once)."""
    alive: set[str] = set()
    lock = threading.Lock()

    def ping(peer: str) -> None:
        try:
            transport.request(peer, Message(kind=PING), timeout=timeout)
        except GeotrainError:
            return
        with lock:
            alive.add(peer)

    threads = [threading.Thread(target=ping, args=(p,), name="gt-ping", daemon=True) for p in sorted(peers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 1.0)
    with lock:
        return set(alive)


def measure_link(transport: Transport, peer_id: str, config: ProbeConfig | None = None) -> LinkMeasurement:
    """Measure RTT and bandwidth from this transport to ``peer_id`` (which runs :func:`serve_probes`)."""
    cfg = config or ProbeConfig()
    rtts = []
    for _ in range(cfg.pings):
        t0 = time.perf_counter()
        transport.request(peer_id, Message(kind=PING), timeout=cfg.ping_timeout_s)
        rtts.append(time.perf_counter() - t0)
    rtt = statistics.median(rtts)

    def bulk(nbytes: int) -> float:
        payload = torch.zeros(nbytes, dtype=torch.uint8)
        t0 = time.perf_counter()
        transport.request(peer_id, Message(kind=BULK, tensors={"x": payload}), timeout=cfg.timeout_s)
        return time.perf_counter() - t0

    # Ramp up with single transfers, jumping to the size the last one predicts takes min_transfer_s
    # (a fast link is not walked through every doubling), then measure that size `rounds` times in
    # all, the ramp's last transfer included when it already had that size.
    size = cfg.start_bytes
    t = bulk(size)
    while t < cfg.min_transfer_s and size < cfg.max_bytes:
        want = size * cfg.min_transfer_s / max(t, 1e-6) * 1.25
        size = int(min(cfg.max_bytes, max(size * 2, want)))
        t = bulk(size)
    times = [t] + [bulk(size) for _ in range(cfg.rounds - 1)]
    elapsed = statistics.median(times)
    transfer = max(elapsed - rtt, 1e-6)
    return LinkMeasurement(
        src=transport.peer_id,
        dst=peer_id,
        bandwidth_bps=size / transfer,
        rtt_s=rtt,
        measured_at=time.time(),
        probe_bytes=size,
    )
