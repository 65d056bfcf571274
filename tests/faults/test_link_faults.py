"""Item 9: a link reset or blackholed mid-tensor. The partial tensor is discarded, never half-delivered.

The sender's ZMQ DEALER connects through :class:`~geotrain.testing.faultproxy.FaultProxy`
to the receiver's inbox. ZMQ delivers a multipart message whole or not at all,
and the transport checks every declared length, so the receiver sees either
the complete tensor or a timeout, and once the link heals traffic flows again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import torch

from geotrain.errors import ConfigError, PeerTimeoutError
from geotrain.testing.faultproxy import Fault, FaultProxy, FaultProxyConfig
from geotrain.transport import Message, Transport, TransportConfig

N = 256 * 1024  # fp32 elements: a 1 MiB tensor, so a fault can land in its middle
TENSOR_BYTES = 4 * N


@pytest.fixture
def link() -> Iterator[tuple[Transport, Transport, FaultProxy]]:
    rx = Transport(TransportConfig(), peer_id="rx").start()
    proxy = FaultProxy(FaultProxyConfig(target=rx.address)).start()
    tx = Transport(TransportConfig(), peer_id="tx").start()
    tx.connect("rx", proxy.address)
    try:
        yield tx, rx, proxy
    finally:
        tx.close()
        proxy.close()
        rx.close()


def payload(seed: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(seed))


def warm_up(tx: Transport, rx: Transport) -> None:
    # the connection (and ZMQ's handshake) exists before the fault is armed
    tx.send("rx", Message(kind="hello"), timeout=10)
    rx.recv("hello", timeout=10)


def assert_heals(tx: Transport, rx: Transport, proxy: FaultProxy, connections: int) -> None:
    # send once ZMQ has reconnected: a message queued onto the dying connection would be lost with it
    proxy.wait_connections(connections + 1, timeout=20)
    x = payload(2)
    tx.send("rx", Message(kind="t", tag=(2,), tensors={"x": x}), timeout=10)
    got = rx.recv("t", (2,), timeout=20)
    assert torch.equal(got.tensors["x"], x)
    assert not rx.stats.dropped, rx.stats.dropped  # nothing malformed ever reached the inbox


def test_reset_mid_tensor_loses_the_message_whole_and_the_link_reconnects(link: tuple[Transport, Transport, FaultProxy]) -> None:
    tx, rx, proxy = link
    warm_up(tx, rx)
    proxy.set_fault(Fault(kind="reset", after_bytes=TENSOR_BYTES // 2))
    before, conns = rx.stats.recv_messages, proxy.stats.connections
    tx.send("rx", Message(kind="t", tag=(1,), tensors={"x": payload(1)}), timeout=10)
    assert proxy.wait_fired(20), proxy.stats
    with pytest.raises(PeerTimeoutError):
        rx.recv("t", (1,), timeout=2.0)
    assert rx.stats.recv_messages == before  # not a truncated copy either
    assert proxy.stats.fired_at == TENSOR_BYTES // 2 and proxy.stats.resets == 1  # the reset landed mid-tensor
    assert_heals(tx, rx, proxy, conns)  # ZMQ reconnects through the proxy; the reset was one-shot


def test_blackhole_mid_tensor_delivers_nothing_until_the_route_heals(link: tuple[Transport, Transport, FaultProxy]) -> None:
    tx, rx, proxy = link
    warm_up(tx, rx)
    proxy.set_fault(Fault(kind="blackhole", after_bytes=TENSOR_BYTES // 3))
    before = rx.stats.recv_messages
    tx.send("rx", Message(kind="t", tag=(1,), tensors={"x": payload(1)}), timeout=10)
    assert proxy.wait_fired(20)
    with pytest.raises(PeerTimeoutError):
        rx.recv("t", (1,), timeout=2.0)
    assert rx.stats.recv_messages == before
    assert proxy.stats.swallowed > 0
    # the route comes back as a fresh connection (the old one is torn down, as a TCP keepalive would)
    proxy.set_fault(Fault())
    conns = proxy.stats.connections
    assert proxy.reset_all() >= 1
    assert_heals(tx, rx, proxy, conns)


def test_rate_cap_delays_but_delivers_the_tensor_intact(link: tuple[Transport, Transport, FaultProxy]) -> None:
    tx, rx, proxy = link
    warm_up(tx, rx)
    rate = 4 * 1024 * 1024  # 4 MiB/s: the 1 MiB tensor needs at least 0.25 s
    proxy.set_fault(Fault(kind="rate", rate_bytes_per_s=rate))
    x = payload(3)
    t0 = time.monotonic()
    tx.send("rx", Message(kind="t", tag=(3,), tensors={"x": x}), timeout=10)
    got = rx.recv("t", (3,), timeout=20)
    took = time.monotonic() - t0
    assert torch.equal(got.tensors["x"], x)
    assert took >= 0.9 * TENSOR_BYTES / rate, took


def test_pass_through_forwards_replies_both_ways(link: tuple[Transport, Transport, FaultProxy]) -> None:
    tx, rx, proxy = link
    rx.serve("echo", lambda m: Message(kind="echo.ok", tensors=m.tensors))
    x = payload(4)
    reply = tx.request("rx", Message(kind="echo", tensors={"x": x}), timeout=20)
    assert torch.equal(reply.tensors["x"], x)
    s = proxy.stats
    assert s.up >= TENSOR_BYTES and s.down >= TENSOR_BYTES and s.resets == 0


@pytest.mark.parametrize(
    "kwargs,words",
    [
        ({"kind": "explode"}, "fault.kind"),
        ({"kind": "rate"}, "rate_bytes_per_s"),
        ({"kind": "reset", "after_bytes": -1}, "after_bytes"),
        ({"direction": "sideways"}, "direction"),
    ],
)
def test_fault_config_errors_name_the_fix(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        Fault(**kwargs)  # type: ignore[arg-type]


def test_proxy_target_must_be_host_port() -> None:
    with pytest.raises(ConfigError, match="tcp://host:port"):
        FaultProxyConfig(target="nowhere")
