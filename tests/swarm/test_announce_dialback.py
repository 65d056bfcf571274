"""Bind vs announce and dial-back on the data plane (loopback; the namespace tests are in tests/emulate)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import torch
import zmq

from geotrain.errors import ConfigError, PeerTimeoutError
from geotrain.peers.probe import serve_probes
from geotrain.transport import CurveConfig, Message, Transport, TransportConfig
from geotrain.transport.addresses import (
    DIAL_BACK,
    advertised_endpoints,
    interface_addresses,
    is_unspecified,
    parse_announce,
    split_endpoint,
)


@pytest.fixture
def started() -> Iterator[list[Transport]]:
    out: list[Transport] = []
    yield out
    for t in out:
        t.close()


def _start(started: list[Transport], config: TransportConfig, peer_id: str) -> Transport:
    t = Transport(config, peer_id=peer_id).start()
    started.append(t)
    return t


def test_bound_to_every_interface_publishes_no_unspecified_address(started: list[Transport]) -> None:
    t = _start(started, TransportConfig(host="0.0.0.0"), "a")
    assert t.bound_address.startswith("tcp://0.0.0.0:")
    _, port = split_endpoint(t.bound_address)
    assert t.endpoints, "a peer bound to 0.0.0.0 must publish its interfaces' addresses"
    for ep in t.endpoints:
        host, p = split_endpoint(ep)
        assert not is_unspecified(host) and p == port
    assert t.address == t.endpoints[0]
    # non-loopback first when the machine has such an address
    if any(not a.startswith("127.") for a in interface_addresses(family=socket.AF_INET)):
        assert not split_endpoint(t.address)[0].startswith("127.")


def test_announce_is_published_exactly(started: list[Transport]) -> None:
    t = _start(started, TransportConfig(host="0.0.0.0", announce=("203.0.113.7", "198.51.100.2:4000")), "a")
    _, port = split_endpoint(t.bound_address)
    assert t.endpoints == (f"tcp://203.0.113.7:{port}", "tcp://198.51.100.2:4000")
    assert t.address == f"tcp://203.0.113.7:{port}"


def test_fixed_port_is_honoured(started: list[Transport]) -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    t = _start(started, TransportConfig(host="127.0.0.1", port=port), "a")
    assert t.bound_address == f"tcp://127.0.0.1:{port}" and t.address == t.bound_address


def test_parse_announce_refuses_unspecified_and_bad_items() -> None:
    assert parse_announce("1.2.3.4, host.example:99,[2001:db8::1]") == ("1.2.3.4", "host.example:99", "[2001:db8::1]")
    assert parse_announce(None) == ()
    for bad in ("0.0.0.0", "[::]", "a b", "1.2.3.4:0", "1.2.3.4:70000"):
        with pytest.raises(ConfigError):
            parse_announce(bad)
    assert advertised_endpoints("tcp://0.0.0.0:5", ("[2001:db8::1]",)) == ("tcp://[2001:db8::1]:5",)


def _echo(t: Transport) -> None:
    t.serve("echo", lambda m: Message("echo.ok", meta={"from": t.peer_id}))


@pytest.mark.parametrize("closed", [False, True], ids=["open", "curve"])
def test_dial_out_peer_talks_both_ways_over_its_own_connection(started: list[Transport], closed: bool) -> None:
    pub_curve = nat_curve = None
    if closed:
        pub_pk, pub_sk = zmq.curve_keypair()
        nat_pk, nat_sk = zmq.curve_keypair()
        pub_curve = CurveConfig(public_key=pub_pk, secret_key=pub_sk, allowed_clients=frozenset({nat_pk}))
        nat_curve = CurveConfig(public_key=nat_pk, secret_key=nat_sk, allowed_clients=frozenset({pub_pk}))
    pub = _start(started, TransportConfig(curve=pub_curve), "pub")
    nat = _start(started, TransportConfig(dial_out=True, curve=nat_curve), "nat")
    assert nat.address == DIAL_BACK and nat.reachable is False
    _echo(pub)
    _echo(nat)
    serve_probes(nat)
    # the reachable peer is told nothing but "dial back": it opens no socket to nat
    pub.connect("nat", nat.address, curve_server_key=None if nat_curve is None else nat_curve.public_key)
    nat.connect("pub", pub.address, curve_server_key=None if pub_curve is None else pub_curve.public_key)
    x = torch.arange(6, dtype=torch.float32)
    pub.send("nat", Message("act", tag=(1,), tensors={"x": x}), timeout=10)
    got = nat.recv("act", (1,), timeout=10)
    assert got.sender == "pub" and torch.equal(got.tensors["x"], x)
    nat.send("pub", Message("grad", tag=(1,), tensors={"x": -x}), timeout=10)
    assert torch.equal(pub.recv("grad", (1,), timeout=10).tensors["x"], -x)
    # requests both ways: nat's reply to pub's request goes back over nat's outbox
    assert pub.request("nat", Message("echo"), timeout=10).meta["from"] == "nat"
    assert nat.request("pub", Message("echo"), timeout=10).meta["from"] == "pub"
    assert pub.request("nat", Message("probe.ping"), timeout=10).kind == "probe.ping.ok"


def test_dial_back_send_waits_for_a_hello_and_times_out_without_one(started: list[Transport]) -> None:
    pub = _start(started, TransportConfig(), "pub")
    pub.connect("nat", DIAL_BACK)
    with pytest.raises(PeerTimeoutError):
        pub.send("nat", Message("act"), timeout=0.3)
    nat = _start(started, TransportConfig(dial_out=True), "nat")
    fut = pub.send_async("nat", Message("act", tag=(2,)), timeout=10)  # queued until nat says hello
    nat.connect("pub", pub.address)
    assert nat.recv("act", (2,), timeout=10).sender == "pub"
    assert fut.result(timeout=10) > 0


def test_curve_route_needs_the_connected_key(started: list[Transport]) -> None:
    """A member claiming another's peer id cannot take its route: the hello must come with that peer's key."""
    keys = {name: zmq.curve_keypair() for name in ("pub", "nat", "forger")}
    allowed = frozenset({keys["nat"][0], keys["forger"][0]})
    pub = _start(started, TransportConfig(curve=CurveConfig(public_key=keys["pub"][0], secret_key=keys["pub"][1],
                                                            allowed_clients=allowed)), "pub")
    forger = _start(started, TransportConfig(dial_out=True, curve=CurveConfig(
        public_key=keys["forger"][0], secret_key=keys["forger"][1])), "nat")
    pub.connect("nat", DIAL_BACK, curve_server_key=keys["nat"][0])
    forger.connect("pub", pub.address, curve_server_key=keys["pub"][0])
    with pytest.raises(PeerTimeoutError):
        pub.send("nat", Message("act", tag=(3,)), timeout=1.0)
    with pytest.raises(PeerTimeoutError):
        forger.recv("act", (3,), timeout=0.2)


@pytest.mark.parametrize("closed", [False, True], ids=["open", "curve"])
def test_two_dial_out_peers_talk_through_a_relay(started: list[Transport], closed: bool) -> None:
    keys = {name: zmq.curve_keypair() for name in ("relay", "a", "b")}

    def cfg(name: str, **kw: object) -> TransportConfig:
        if not closed:
            return TransportConfig(**kw)  # type: ignore[arg-type]
        others = frozenset(k[0] for n, k in keys.items() if n != name)
        return TransportConfig(curve=CurveConfig(public_key=keys[name][0], secret_key=keys[name][1],
                                                 allowed_clients=others), **kw)  # type: ignore[arg-type]

    def key(name: str) -> bytes | None:
        return keys[name][0] if closed else None

    relay = _start(started, cfg("relay"), "relay")
    a = _start(started, cfg("a", dial_out=True), "a")
    b = _start(started, cfg("b", dial_out=True), "b")
    _echo(b)
    for nat in (a, b):  # both dial the relay; the relay is told they are behind NAT
        nat.connect("relay", relay.address, curve_server_key=key("relay"))
        relay.connect(nat.peer_id, f"{DIAL_BACK}relay", curve_server_key=key(nat.peer_id))
    a.connect("b", f"{DIAL_BACK}relay", curve_server_key=key("b"))
    b.connect("a", f"{DIAL_BACK}relay", curve_server_key=key("a"))
    x = torch.arange(1000, dtype=torch.float32)
    a.send("b", Message("act", tag=(5,), tensors={"x": x}), timeout=10)
    got = b.recv("act", (5,), timeout=10)
    assert got.sender == "a" and torch.equal(got.tensors["x"], x)
    b.send("a", Message("grad", tag=(5,), tensors={"x": -x}), timeout=10)
    assert torch.equal(a.recv("grad", (5,), timeout=10).tensors["x"], -x)
    assert a.request("b", Message("echo"), timeout=10).meta["from"] == "b"  # and the reply comes back relayed
    assert relay.stats.relayed_bytes >= 2 * x.numel() * 4


def test_a_relay_cannot_pass_off_one_peers_message_as_anothers(started: list[Transport]) -> None:
    """The destination accepts a relayed message only from the sender the relay names."""
    from geotrain.transport import message as msgcodec
    from geotrain.transport.endpoint import RELAYED

    b = _start(started, TransportConfig(dial_out=True), "b")
    rogue = zmq.Context.instance().socket(zmq.ROUTER)  # plays a relay that b dialled
    try:
        port = rogue.bind_to_random_port("tcp://127.0.0.1")
        b.connect("relay", f"tcp://127.0.0.1:{port}")
        route, *_ = rogue.recv_multipart()  # b's hello
        inner = msgcodec.encode(Message("act", tag=(9,)), sender="mallory")
        outer = msgcodec.encode(Message(RELAYED, meta={"from": "alice"}), sender="relay")
        rogue.send_multipart([route, *outer, *inner])
        honest = msgcodec.encode(Message("act", tag=(10,)), sender="alice")
        rogue.send_multipart([route, *outer, *honest])
        assert b.recv("act", (10,), timeout=10).sender == "alice"
        with pytest.raises(PeerTimeoutError):
            b.recv("act", (9,), timeout=0.2)
        assert b.stats.dropped["AuthenticationError"] == 1
    finally:
        rogue.close(linger=0)


def test_a_relay_holds_traffic_for_a_peer_it_has_not_connected_yet(started: list[Transport]) -> None:
    relay = _start(started, TransportConfig(), "relay")
    a = _start(started, TransportConfig(dial_out=True), "a")
    b = _start(started, TransportConfig(dial_out=True), "b")
    for nat in (a, b):
        nat.connect("relay", relay.address)
    a.connect("b", f"{DIAL_BACK}relay")
    a.send("b", Message("act", tag=(7,)), timeout=10)  # the relay knows nothing of b yet
    with pytest.raises(PeerTimeoutError):
        b.recv("act", (7,), timeout=0.3)
    relay.connect("b", DIAL_BACK)  # now it does: the held message goes out
    assert b.recv("act", (7,), timeout=10).sender == "a"
