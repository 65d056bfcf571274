"""A record write is done once a quorum of its replicas took it: a slow replica finishes in the background.

A replica behind a congested link (the very link a pipeline saturates) answered only at hivemind's RPC
timeout, and every heartbeat waited for it: the record it renewed had expired by the time the next one came.
``store_direct`` runs inside the DHT process on hivemind's node; here it runs on a stand-in node whose replicas
answer at once, except one that answers only when the test lets it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hivemind.dht.routing import DHTID
from hivemind.utils.serializer import MSGPackSerializer

from geotrain.swarm import dht_process


class _Storage:
    def store(self, *args: Any, **kwargs: Any) -> bool:
        return True


class _Protocol:
    client_mode = True  # this node keeps no copy: every write goes out
    serializer = MSGPackSerializer
    record_validator = None
    storage = _Storage()

    def __init__(self, slow: str, release: asyncio.Event) -> None:
        self.slow, self.release, self.calls = slow, release, []

    async def call_store(self, peer: str, **kwargs: Any) -> list[bool] | None:
        self.calls.append(peer)
        if peer == self.slow:
            await self.release.wait()
        return [True]


class _Node:
    num_replicas = 5

    def __init__(self, protocol: _Protocol, peers: list[str]) -> None:
        self.protocol, self.peers, self.node_id = protocol, peers, DHTID.generate(source="me")

    async def find_nearest_nodes(self, keys: list[DHTID], **kwargs: Any) -> dict[DHTID, dict[DHTID, str]]:
        return {keys[0]: {DHTID.generate(source=p): p for p in self.peers}}


def test_a_write_returns_once_three_replicas_took_it_and_the_slow_one_finishes_after() -> None:
    async def scenario() -> tuple[bool, list[str], int, int]:
        release = asyncio.Event()
        protocol = _Protocol("r0", release)
        node = _Node(protocol, ["r0", "r1", "r2", "r3"])
        dht_process._REPLICAS.clear()
        ok = await asyncio.wait_for(dht_process.store_direct(
            None, node, key="k", subkey=b"s", value=b"v", expiration=1e12, refresh_s=300.0, beam=5), timeout=10)
        waiting = len(dht_process._STRAGGLERS)
        release.set()
        for _ in range(100):  # the straggler completes on the loop's next turns
            if not dht_process._STRAGGLERS:
                break
            await asyncio.sleep(0)
        return ok, sorted(protocol.calls), waiting, len(dht_process._STRAGGLERS)

    ok, calls, waiting, left = asyncio.run(scenario())
    assert ok and calls == ["r0", "r1", "r2", "r3"]  # every replica was written to
    assert waiting == 1 and left == 0  # the write returned while r0 still worked on it, which then finished
    assert dht_process._REPLICAS  # three took it: the replicas need no new lookup


def test_a_record_with_three_replicas_goes_to_the_keys_three_nearest_and_is_done_once_two_took_it() -> None:
    """The progress record (the job's liveness signal, rewritten every few seconds) is kept by 3 replicas, not 5:
    the nearest 3, which a quick read asks first; a majority of them (2) must take it before the write returns."""
    peers = ["r0", "r1", "r2", "r3", "r4", "r5"]
    key_id = DHTID.generate(source="k")
    nearest = sorted(peers, key=lambda p: key_id.xor_distance(DHTID.generate(source=p)))

    async def scenario() -> tuple[bool, list[str], int]:
        release = asyncio.Event()
        protocol = _Protocol(nearest[0], release)
        node = _Node(protocol, peers)
        dht_process._REPLICAS.clear()
        ok = await asyncio.wait_for(dht_process.store_direct(
            None, node, key="k", subkey=b"s", value=b"v", expiration=1e12, refresh_s=300.0, beam=5, replicas=3),
            timeout=10)
        waiting = len(dht_process._STRAGGLERS)
        release.set()
        for _ in range(100):
            if not dht_process._STRAGGLERS:
                break
            await asyncio.sleep(0)
        return ok, sorted(protocol.calls), waiting

    ok, calls, waiting = asyncio.run(scenario())
    assert ok and calls == sorted(nearest[:3])  # the 3 nearest only, not the 5
    assert waiting == 1  # done with 2 of 3 while the slow one finished after


def test_a_replica_count_counts_this_node_when_it_is_among_the_nearest() -> None:
    """A full node among the key's 3 nearest keeps one of the 3 copies itself and writes 2 out; its own copy
    counts towards the majority, so the write is done once one other replica took it."""

    class _FullProtocol(_Protocol):
        client_mode = False

    key_id, me = DHTID.generate(source="k"), DHTID.generate(source="me")
    ranked = sorted([f"r{i}" for i in range(40)], key=lambda p: key_id.xor_distance(DHTID.generate(source=p)))
    nearer = [p for p in ranked if key_id.xor_distance(DHTID.generate(source=p)) < key_id.xor_distance(me)]
    farther = [p for p in ranked if p not in nearer]
    peers = nearer[:1] + farther[:5]  # this node is the nearest or the second nearest of 7
    expected = sorted((nearer[:1] + farther)[:2])

    async def scenario() -> tuple[bool, list[str], int]:
        release = asyncio.Event()
        protocol = _FullProtocol(expected[0], release)
        node = _Node(protocol, peers)
        dht_process._REPLICAS.clear()
        ok = await asyncio.wait_for(dht_process.store_direct(
            None, node, key="k", subkey=b"s", value=b"v", expiration=1e12, refresh_s=300.0, beam=5, replicas=3),
            timeout=10)
        waiting = len(dht_process._STRAGGLERS)
        release.set()
        for _ in range(100):
            if not dht_process._STRAGGLERS:
                break
            await asyncio.sleep(0)
        return ok, sorted(protocol.calls), waiting

    ok, calls, waiting = asyncio.run(scenario())
    assert ok and calls == expected and waiting == 1  # 2 out, 1 kept here; done with here + 1


def test_the_replica_lookup_asks_for_the_keys_sibling_whose_nearest_nodes_are_the_keys_own() -> None:
    """hivemind's find answers, from every node it asks, that node's stored value for the id looked up: for the
    peers' or the progress dictionary, N records per answer. The lookup asks for the key's sibling id (last bit
    flipped), which nobody stores anything under and whose nearest nodes are the key's."""
    asked: list[DHTID] = []

    class _AskedNode(_Node):
        async def find_nearest_nodes(self, keys: list[DHTID], **kwargs: Any) -> dict[DHTID, dict[DHTID, str]]:
            asked.extend(keys)
            return await super().find_nearest_nodes(keys, **kwargs)

    async def scenario() -> bool:
        protocol = _Protocol("none", asyncio.Event())
        dht_process._REPLICAS.clear()
        return await asyncio.wait_for(dht_process.store_direct(
            None, _AskedNode(protocol, ["r0", "r1", "r2"]), key="k", subkey=b"s", value=b"v", expiration=1e12,
            refresh_s=300.0, beam=5), timeout=10)

    assert asyncio.run(scenario())
    key_id = DHTID.generate(source="k")
    assert asked == [DHTID(int(key_id) ^ 1)]
    for seed in range(200):  # the 5 nearest of a key and of its sibling are the same nodes, in the same order
        nodes = [DHTID.generate(source=f"{seed}-{i}") for i in range(50)]
        key = DHTID.generate(source=f"key-{seed}")
        sibling = DHTID(int(key) ^ 1)
        assert sorted(nodes, key=key.xor_distance)[:5] == sorted(nodes, key=sibling.xor_distance)[:5]
