"""Item 24: with CURVE, a member's traffic is encrypted on the wire and an unknown client is refused.

The "capture" is a :class:`FaultProxy` in pass-through mode between sender and
receiver that keeps every byte it forwards: exactly what a sniffer on loopback
would see of that TCP stream. The tensor carries a distinctive 64-byte pattern;
in the clear it shows up in the capture (the control, so the check can fail),
under CURVE it must not, and neither must the message kind. The joining of a
whole closed swarm (records, planning, an outsider ignored) is
``tests/coordinator/test_admission.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import zmq

from geotrain.errors import PeerTimeoutError
from geotrain.testing.faultproxy import FaultProxy, FaultProxyConfig
from geotrain.transport import CurveConfig, Message, Transport, TransportConfig

PATTERN = bytes(range(0x41, 0x41 + 64))  # 64 distinct printable bytes


def curve(allowed: frozenset[bytes] = frozenset()) -> CurveConfig:
    public, secret = zmq.curve_keypair()
    return CurveConfig(public_key=public, secret_key=secret, allowed_clients=allowed)


def marked_tensor() -> torch.Tensor:
    return torch.frombuffer(bytearray(PATTERN * 64), dtype=torch.uint8)  # a raw (lossless) tensor, 4 KiB


@pytest.fixture
def started() -> Iterator[list[Transport]]:
    ts: list[Transport] = []
    yield ts
    for t in ts:
        t.close()


def _exchange(rx_cfg: TransportConfig, tx_cfg: TransportConfig, started: list[Transport], server_key: bytes | None) -> bytes:
    rx = Transport(rx_cfg, peer_id="rx").start()
    started.append(rx)
    tx = Transport(tx_cfg, peer_id="tx").start()
    started.append(tx)
    with FaultProxy(FaultProxyConfig(target=rx.address, capture_bytes=1 << 20)) as sniffer:
        tx.connect("rx", sniffer.address, curve_server_key=server_key)
        x = marked_tensor()
        tx.send("rx", Message(kind="secret.kind", tensors={"x": x}), timeout=10)
        got = rx.recv("secret.kind", timeout=20)
        assert torch.equal(got.tensors["x"], x)
        return sniffer.captured("up")


def test_plaintext_control_shows_the_payload_on_the_wire(started: list[Transport]) -> None:
    wire = _exchange(TransportConfig(), TransportConfig(), started, None)
    assert PATTERN in wire and b"secret.kind" in wire


def test_member_traffic_under_curve_is_encrypted(started: list[Transport]) -> None:
    tx_curve = curve()
    rx_curve = curve(allowed=frozenset({tx_curve.public_key}))
    wire = _exchange(TransportConfig(curve=rx_curve), TransportConfig(curve=tx_curve), started, rx_curve.public_key)
    assert len(wire) > len(PATTERN) * 64  # the message did cross the proxy
    assert PATTERN[:16] not in wire and b"secret.kind" not in wire


def test_unknown_curve_client_is_refused_at_the_handshake(started: list[Transport]) -> None:
    member = curve()
    rx_curve = curve(allowed=frozenset({member.public_key}))
    rx = Transport(TransportConfig(curve=rx_curve), peer_id="rx").start()
    started.append(rx)
    stranger = Transport(TransportConfig(curve=curve()), peer_id="stranger").start()  # knows rx's key, not a member
    started.append(stranger)
    stranger.connect("rx", rx.address, curve_server_key=rx_curve.public_key)
    stranger.send_async("rx", Message(kind="hello", tensors={"x": marked_tensor()}))
    with pytest.raises(PeerTimeoutError):
        rx.recv("hello", timeout=2.0)
    assert rx.stats.recv_messages == 0
    assert rx.stats.dropped["AuthenticationError"] >= 1  # refused, counted


def test_a_member_cannot_speak_for_another_member(started: list[Transport]) -> None:
    a, m, r = curve(), curve(), curve()
    r_cfg = CurveConfig(public_key=r.public_key, secret_key=r.secret_key,
                        allowed_clients=frozenset({a.public_key, m.public_key}))
    rx = Transport(TransportConfig(curve=r_cfg), peer_id="rx").start()
    genuine = Transport(TransportConfig(curve=a), peer_id="a").start()
    forger = Transport(TransportConfig(curve=m), peer_id="a").start()  # an admitted member claiming to be "a"
    started.extend([rx, genuine, forger])
    rx.connect("a", genuine.address, curve_server_key=a.public_key)  # rx knows a's key from its record
    forger.connect("rx", rx.address, curve_server_key=r.public_key)
    forger.send("rx", Message(kind="pp.act", tag=(0,), tensors={"x": torch.zeros(3)}), timeout=10)
    with pytest.raises(PeerTimeoutError):
        rx.recv("pp.act", (0,), timeout=2)
    assert rx.stats.dropped["AuthenticationError"] >= 1
    genuine.connect("rx", rx.address, curve_server_key=r.public_key)
    genuine.send("rx", Message(kind="pp.act", tag=(1,), tensors={"x": torch.ones(3)}), timeout=10)
    assert torch.equal(rx.recv("pp.act", (1,), timeout=20).tensors["x"], torch.ones(3))
