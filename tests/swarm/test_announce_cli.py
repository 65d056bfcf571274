"""`geotrain peer` bound to every interface with fixed ports, as real processes on this machine."""

from __future__ import annotations

import socket

import pytest

from geotrain.local.procs import ChildGroup
from geotrain.transport.addresses import is_unspecified, split_endpoint

pytestmark = pytest.mark.multiprocess


def _free_port() -> int:
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_peer_on_every_interface_honours_ports_and_publishes_no_wildcard(children: ChildGroup) -> None:
    boot = children.start("dht", ["dht"])
    maddrs = boot.wait_event("ready", 60)["maddrs"]
    common = ["--initial-peers", *maddrs, "--device", "cpu", "--heartbeat", "1"]
    helper = children.start("helper", ["peer", "--region", "eu", *common])
    first = helper.wait_event("reachability", 120)
    assert first["reachable"] is None and first["checked_by"] == []  # nobody to ask yet
    helper.wait_event("ready", 120)

    data_port, dht_port = _free_port(), _free_port()
    peer = children.start("wild", ["peer", "--region", "us", "--host", "0.0.0.0", "--port", str(data_port),
                                   "--dht-port", str(dht_port), *common])
    reach = peer.wait_event("reachability", 120)
    assert reach["data_plane"]["port"] == data_port and reach["dht"]["port"] == dht_port
    assert reach["data_plane"]["bound"] == f"tcp://0.0.0.0:{data_port}"
    assert reach["reachable"] is True and reach["checked_by"] and not reach["dial_out"]
    ready = peer.wait_event("ready", 120)
    assert ready["endpoints"] and ready["endpoint"] == ready["endpoints"][0]
    for ep in ready["endpoints"]:
        host, port = split_endpoint(ep)
        assert not is_unspecified(host) and port == data_port
    for m in ready["maddrs"]:
        assert "/0.0.0.0/" not in m and f"/tcp/{dht_port}/" in m

    announced = children.start("announced", ["peer", "--region", "ap", "--host", "0.0.0.0", "--port", "0",
                                              "--dht-port", str(_free_port()), "--announce", "127.0.0.1", *common])
    ready = announced.wait_event("ready", 120)
    assert [split_endpoint(e)[0] for e in ready["endpoints"]] == ["127.0.0.1"]
    assert all("/ip4/127.0.0.1/" in m for m in ready["maddrs"])
