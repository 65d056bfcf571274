"""The reachability preflight, who may be dialled, and what a plan may use (loopback; no DHT)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from geotrain.cli.status import problems, reachability_word
from geotrain.errors import ConfigError, PeerTimeoutError
from geotrain.peers.probe import serve_probes
from geotrain.peers.reachability import (
    Reachability,
    ReachabilityConfig,
    assign_relay,
    helpers_for,
    may_dial,
    plannable_peers,
    preflight,
    swarm_helpers,
)
from geotrain.plan import StageSlot
from geotrain.swarm import SwarmConfig
from geotrain.swarm.records import DIAL_BACK, PeerRecord
from geotrain.transport import Transport, TransportConfig
from geotrain.transport.addresses import parse_host_list


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


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rec(peer_id: str, **changes: object) -> PeerRecord:
    now = time.time()
    fields: dict[str, object] = dict(
        peer_id=peer_id, region="eu", device="cpu", flops=1e9, memory_bytes=2**30, usd_per_hour=0.0,
        endpoint="tcp://127.0.0.1:5555", version="0.1", started_at=now, heartbeat_at=now,
    )  # fmt: skip
    fields.update(changes)
    return PeerRecord(**fields)  # type: ignore[arg-type]


def test_a_dialled_back_peer_is_reachable(started: list[Transport]) -> None:
    helper = _start(started, TransportConfig(), "helper")
    serve_probes(helper)
    me = _start(started, TransportConfig(), "me")
    dht_port = _closed_port()
    result = preflight(me, helpers=[("helper", helper.address, None)],
                       dht_maddrs=[f"/ip4/127.0.0.1/tcp/{dht_port}/p2p/QmX"])
    assert result.reachable is True and me.reachable is True
    assert result.data_plane == {me.address: True}
    assert result.dht == {f"tcp://127.0.0.1:{dht_port}": False}  # nothing listens there
    assert result.checked_by == ("helper",) and result.seen_from == ("127.0.0.1",)
    assert result.fix(dht_port=dht_port, data_port=1)  # the DHT port needs opening


def test_helpers_are_asked_at_once_so_a_silent_one_costs_no_turn(started: list[Transport]) -> None:
    import threading

    helper = _start(started, TransportConfig(), "helper")
    serve_probes(helper)
    me = _start(started, TransportConfig(), "me")
    release = threading.Event()
    real = me.request

    def request(peer_id: str, msg, **kw):  # type: ignore[no-untyped-def]
        if peer_id == "silent":  # a helper that never answers (gone, or refusing an outsider)
            release.wait(60)
            raise PeerTimeoutError("silent never answered")
        return real(peer_id, msg, **kw)

    me.request = request  # type: ignore[method-assign]
    out: list[Reachability] = []
    t = threading.Thread(target=lambda: out.append(preflight(
        me, helpers=[("silent", "tcp://127.0.0.1:1", None), ("helper", helper.address, None)],
        config=ReachabilityConfig(helpers=1, request_timeout_s=60.0))))
    t.start()
    t.join(30)
    try:
        assert not t.is_alive() and not release.is_set()  # answered while the silent helper still blocks
        (result,) = out
        assert result.reachable is True and result.checked_by == ("helper",)
    finally:
        release.set()


def test_an_announced_address_nothing_answers_at_is_unreachable(started: list[Transport]) -> None:
    helper = _start(started, TransportConfig(), "helper")
    serve_probes(helper)
    me = _start(started, TransportConfig(announce=(f"127.0.0.1:{_closed_port()}",)), "me")
    result = preflight(me, helpers=[("helper", helper.address, None)])
    assert result.reachable is False and me.reachable is False
    assert "--nat" in result.fix(dht_port=1, data_port=2)


def test_a_private_address_the_request_does_not_come_from_is_never_dialled(started: list[Transport]) -> None:
    helper = _start(started, TransportConfig(), "helper")
    serve_probes(helper)
    # a home peer announcing its LAN address: the helper sees the request come from 127.0.0.1 instead
    me = _start(started, TransportConfig(announce=("192.168.77.5",)), "me")
    result = preflight(me, helpers=[("helper", helper.address, None)])
    assert result.reachable is False and result.seen_from == ("127.0.0.1",)
    assert "--announce 127.0.0.1" in result.fix(dht_port=1, data_port=2)
    assert not may_dial("192.168.77.5", "127.0.0.1") and not may_dial("10.1.2.3", None)
    assert may_dial("10.1.2.3", "10.1.2.3") and may_dial("8.8.8.8", "10.1.2.3") and may_dial("10.0.0.1", "::ffff:10.0.0.1")
    assert not may_dial("example.org", "10.1.2.3")


def test_no_helper_means_unknown(started: list[Transport]) -> None:
    me = _start(started, TransportConfig(), "me")
    gone = _closed_port()
    result = preflight(me, helpers=[("ghost", f"tcp://127.0.0.1:{gone}", None)],
                       config=ReachabilityConfig(request_timeout_s=0.3))
    assert result.reachable is None and me.reachable is None and result.fix(dht_port=1, data_port=2) == ""


def test_helpers_are_dialable_peers_from_other_regions_first() -> None:
    peers = {
        "me": rec("me"),
        "same": rec("same", region="eu", reachable=True),
        "far": rec("far", region="us", reachable=True),
        "nat": rec("nat", region="us", endpoint=DIAL_BACK, reachable=False),
        "bad": rec("bad", region="us", reachable=False),
    }
    assert [r.peer_id for r in helpers_for(peers, me="me", region="eu", count=5)] == ["far", "same"]


class _Swarm:
    """What :func:`swarm_helpers` reads of a swarm: its records, its id, its admission (None: no swarm key)."""

    def __init__(self, peers: dict[str, PeerRecord], admission: object = None) -> None:
        self.peers, self.admission, self.peer_id = peers, admission, "me"

    def get_peers(self) -> dict[str, PeerRecord]:
        return self.peers

    def get_jobs(self) -> dict[str, object]:
        return {}


def test_a_peer_without_the_swarm_key_asks_no_member_of_a_closed_swarm(caplog: pytest.LogCaptureFixture) -> None:
    # a member's data plane refuses a keyless peer at the handshake: asking it would cost request_timeout_s
    proof = "ab" * 32
    members = {p: rec(p, region="us", reachable=True, admission=proof) for p in ("m1", "m2")}
    assert swarm_helpers(_Swarm({"me": rec("me"), **members}), region="eu", count=4) == []
    assert "closed swarm" in caplog.text and "--swarm-key" in caplog.text
    open_peer = rec("o1", region="us", reachable=True)
    mixed = _Swarm({"me": rec("me"), **members, "o1": open_peer})
    assert [h[0] for h in swarm_helpers(mixed, region="eu", count=4)] == ["o1"]
    # a member (the swarm's records are already verified by its Swarm) asks members
    member = _Swarm({"me": rec("me"), **members}, admission=object())
    assert sorted(h[0] for h in swarm_helpers(member, region="eu", count=4)) == ["m1", "m2"]


def test_plans_take_no_undialable_peer_and_dial_out_peers_only_with_a_relay() -> None:
    peers = {
        "a": rec("a", reachable=True),
        "b": rec("b"),  # not checked yet: planned as before
        "n1": rec("n1", endpoint=DIAL_BACK, reachable=False, flops=1e9),
        "n2": rec("n2", endpoint=DIAL_BACK, reachable=False, flops=5e9),
        "x": rec("x", reachable=False),  # nobody can dial it and it does not dial out
    }
    assert list(plannable_peers(peers)) == ["a", "b", "n1", "n2"]
    assert list(plannable_peers(peers, relays=False)) == ["a", "b", "n2"]  # the fastest dial-out peer only
    only_nat = {k: v for k, v in peers.items() if k.startswith("n")}
    assert list(plannable_peers(only_nat)) == ["n2"]  # nobody could relay between them
    rows = [{**r.to_wire(), "heartbeat_age_s": 0.0, "reachability": reachability_word(r)} for r in peers.values()]
    assert [row["reachability"] for row in rows] == ["reachable", "unknown", "dial-out", "dial-out", "unreachable"]
    found = problems(rows, [])
    assert any("does not dial out" in p and "(eu)" in p for p in found)
    assert any("2 peers are behind NAT" in p for p in found)


def test_announce_flags_are_checked() -> None:
    assert parse_host_list("203.0.113.1,[2001:db8::2]") == ("203.0.113.1", "[2001:db8::2]")
    with pytest.raises(ConfigError, match="hosts only"):
        parse_host_list("203.0.113.1:80")
    with pytest.raises(ConfigError, match="--dht-port"):
        SwarmConfig(announce=("203.0.113.1",))
    cfg = SwarmConfig(host="0.0.0.0", port=4001, announce=("203.0.113.1", "[2001:db8::2]"))
    assert cfg.announce_maddrs() == ["/ip4/203.0.113.1/tcp/4001", "/ip6/2001:db8::2/tcp/4001"]
    wild = SwarmConfig(host="0.0.0.0", port=4001).announce_maddrs()
    assert wild and not any("/0.0.0.0/" in m for m in wild) and all(m.endswith("/tcp/4001") for m in wild)
    assert Reachability(reachable=None).dht_reachable is None


def test_two_dial_out_peers_of_a_plan_get_a_relay_from_their_region() -> None:
    def slot(peer: str, region: str, endpoint: str) -> StageSlot:
        return StageSlot(peer=peer, start=0, end=1, endpoint=endpoint, region=region)

    pipes = [[slot("a", "us", "tcp://10.0.0.1:1"), slot("n1", "home", DIAL_BACK)],
             [slot("h", "home", "tcp://10.0.0.2:1"), slot("n2", "home", DIAL_BACK)]]
    out = assign_relay(pipes)
    assert [[s.endpoint for s in p] for p in out] == [["tcp://10.0.0.1:1", f"{DIAL_BACK}h"],
                                                      ["tcp://10.0.0.2:1", f"{DIAL_BACK}h"]]
    assert assign_relay(pipes[:1]) == pipes[:1]  # one dial-out peer needs no relay


def test_two_dial_out_peers_are_priced_as_two_hops_through_the_best_relay() -> None:
    from geotrain.peers.reachability import relay_candidate, relayed_links
    from geotrain.swarm.records import LinkMeasurement, LinkRow

    def row(src: str, **to: tuple[float, float]) -> LinkRow:
        return LinkRow(src=src, links={d: LinkMeasurement(bandwidth_bps=b, rtt_s=r, measured_at=0.0)
                                       for d, (b, r) in to.items()})

    peers = {p: rec(p, endpoint=DIAL_BACK, reachable=False) for p in ("n1", "n2")}
    peers |= {"fast": rec("fast", reachable=True), "slow": rec("slow", reachable=True)}
    links = {"n1": row("n1", fast=(1e8, 0.01), slow=(1e6, 0.05)), "n2": row("n2", fast=(5e7, 0.02), slow=(1e6, 0.05))}
    assert relay_candidate(peers, links) == "fast"
    assert relayed_links(peers, links) == {("n1", "n2"): (5e7, 0.01 + 0.02)}
    assert relayed_links({k: v for k, v in peers.items() if k != "n2"}, links) == {}  # one NATed peer: direct


def test_a_relay_leg_nobody_measured_is_priced_by_its_regions() -> None:
    """Each home peer measured a different public peer (a few per region, or one probe failed): the two
    legs through either relay are one measured and one priced by the regions' figure, not left out."""
    from geotrain.peers.reachability import relay_candidate, relayed_links
    from geotrain.swarm.records import LinkMeasurement, LinkRow

    def row(src: str, **to: tuple[float, float]) -> LinkRow:
        return LinkRow(src=src, links={d: LinkMeasurement(bandwidth_bps=b, rtt_s=r, measured_at=0.0)
                                       for d, (b, r) in to.items()})

    peers = {p: rec(p, region="home", endpoint=DIAL_BACK, reachable=False) for p in ("n1", "n2")}
    peers |= {p: rec(p, region="pub", reachable=True) for p in ("r1", "r2")}
    links = {"n1": row("n1", r1=(4e7, 0.01)), "n2": row("n2", r2=(2e7, 0.03))}
    assert relay_candidate(peers, links) == "r1"  # its slower leg (3e7, priced) beats r2's (2e7, measured)
    # n1-r1 measured (4e7, 10 ms); r1-n2 unmeasured: home<->pub's median (3e7, 20 ms)
    assert relayed_links(peers, links) == {("n1", "n2"): (3e7, 0.01 + 0.02)}
    # a region nobody measured a pair of prices nothing: no hop is placed there
    lone = peers | {"n3": rec("n3", region="cafe", endpoint=DIAL_BACK, reachable=False)}
    assert relayed_links(lone, links) == {("n1", "n2"): (3e7, 0.01 + 0.02)}
