"""A DHT node closes libp2p connections it has not used for ``idle_connection_s``, and dials again on demand.

libp2p keeps every connection a node opened, each with its keep-alives: in a swarm of a few dozen nodes every
node ends up connected to every other though an idle peer talks to a handful. The choice of what to close is
a pure function of when each peer was last talked to; the loop in the DHT process applies it.
"""

from __future__ import annotations

import pytest

from geotrain.cli import build_parser, given
from geotrain.errors import ConfigError
from geotrain.swarm import Swarm, SwarmConfig
from geotrain.swarm.dht_process import idle_connections
from tests.swarm.helpers import wait_until
from tests.swarm.test_swarm_dht import FAST, peer_record


def test_a_peer_is_idle_past_the_limit_since_its_last_use_or_since_the_start() -> None:
    last = {"a": 100.0, "b": 140.0}
    # "c" was never used: idle since the loop started (t = 90)
    assert idle_connections(["a", "b", "c"], last, now=160.0, since=90.0, idle_s=30.0) == ["a", "c"]
    assert idle_connections(["a", "b", "c"], last, now=160.0, since=90.0, idle_s=60.0) == ["c"]
    assert idle_connections(["a", "b", "c"], last, now=160.0, since=90.0, idle_s=30.0, keep={"c"}) == ["a"]
    assert idle_connections(["a", "b"], last, now=120.0, since=90.0, idle_s=30.0) == []


def test_a_negative_idle_limit_is_refused() -> None:
    with pytest.raises(ConfigError, match="idle_connection_s"):
        SwarmConfig(idle_connection_s=-1.0)


@pytest.mark.parametrize("command", [["peer", "--initial-peers", "/ip4/127.0.0.1/tcp/1", "--region", "eu"], ["dht"]])
def test_the_flag_left_out_keeps_the_configs_default_and_given_overrides_it(command: list[str]) -> None:
    parser = build_parser()
    left_out = parser.parse_args(command)
    assert SwarmConfig(**given(idle_connection_s=left_out.idle_connection)).idle_connection_s == (
        SwarmConfig().idle_connection_s
    )
    never = parser.parse_args([*command, "--idle-connection", "0"])
    assert SwarmConfig(**given(idle_connection_s=never.idle_connection)).idle_connection_s == 0.0


def test_idle_connections_close_and_the_swarm_still_reads_and_writes() -> None:
    idle = dict(FAST, idle_connection_s=1.0)
    boot = Swarm(SwarmConfig(**idle)).start()  # type: ignore[arg-type]
    swarms = [boot]
    try:
        maddrs = tuple(boot.visible_maddrs())
        a = Swarm(SwarmConfig(initial_peers=maddrs, **idle)).start()  # type: ignore[arg-type]
        swarms.append(a)
        b = Swarm(SwarmConfig(initial_peers=maddrs, **idle)).start()  # type: ignore[arg-type]
        swarms.append(b)
        a.publish_peer(peer_record(a.peer_id, region="eu-west"))
        wait_until(lambda: a.peer_id in b.get_peers(thorough=True), timeout=30)
        # nobody talks now: the bootstrap closes its connections to both (they keep theirs to it, their
        # initial peer, but a connection closed from one end is closed)
        wait_until(lambda: boot.connections()["closed"] >= 2, timeout=30)
        # a write and a read dial again
        b.publish_peer(peer_record(b.peer_id, region="us-east"))
        wait_until(lambda: b.peer_id in a.get_peers(thorough=True), timeout=30)
        wait_until(lambda: {a.peer_id, b.peer_id} <= set(boot.get_peers(thorough=True)), timeout=30)
    finally:
        for s in reversed(swarms):
            s.shutdown()


def test_a_limit_of_zero_starts_no_closer() -> None:
    node = Swarm(SwarmConfig(**dict(FAST, idle_connection_s=0.0))).start()  # type: ignore[arg-type]
    try:
        assert node._idle_closer is None
        assert node.connections() == {"connected": 0, "closed": 0}
    finally:
        node.shutdown()
