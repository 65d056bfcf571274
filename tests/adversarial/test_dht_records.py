"""Item 21, the parts not covered in ``tests/swarm``: a member's signed record tampered with, or replayed
with a longer expiry, by someone who copied its bytes off the DHT.

Forged signatures, schema violations, over-nested, crash-level and oversized
values and far-future expirations are ``tests/swarm/test_swarm_dht.py::
test_each_defective_record_is_refused_and_the_honest_one_still_reads``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from geotrain.swarm import Swarm, SwarmConfig
from tests.swarm.helpers import RawClient, wait_until
from tests.swarm.test_swarm_dht import FAST, peer_record

pytestmark = pytest.mark.multiprocess

KEY = "geotrain_peers"


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Swarm, Swarm]]:
    boot = Swarm(SwarmConfig(**FAST)).start()  # type: ignore[arg-type]
    try:
        member = Swarm(SwarmConfig(initial_peers=tuple(boot.visible_maddrs()), **FAST)).start()  # type: ignore[arg-type]
        try:
            yield boot, member
        finally:
            member.shutdown()
    finally:
        boot.shutdown()


def _stored(attacker: RawClient, node_id: str, owner_subkey: bytes) -> tuple[bytes, bytes, float]:
    """The member's record exactly as ``node_id`` stores it: (subkey bytes, signed value bytes, expiration)."""
    from hivemind.dht.routing import DHTID
    from hivemind.p2p import PeerID
    from hivemind.utils import MSGPackSerializer

    key_id = DHTID.generate(source=KEY)
    found = attacker.loop.run_until_complete(
        asyncio.wait_for(attacker.node.protocol.call_find(PeerID.from_base58(node_id), [key_id]), 15)
    )
    value, _ = found[key_id]
    assert value is not None, "nothing stored"
    for subkey, item in value.value.items():
        if subkey == owner_subkey:
            return MSGPackSerializer.dumps(subkey), item.value, item.expiration_time
    raise AssertionError("the member's record is not on that node")


def test_tampered_and_longer_expiry_replays_are_refused(pair: tuple[Swarm, Swarm]) -> None:
    boot, member = pair
    honest = peer_record(member.peer_id, usd_per_hour=1.25)
    hb = member.start_heartbeat(lambda: honest)
    assert hb.wait_first(15)
    victim_subkey = b"[owner:" + member.identity.owner_public_key() + b"]"
    attacker = RawClient(boot.visible_maddrs())
    try:
        sub, signed, expiration = wait_until(lambda: _stored_or_none(attacker, boot.peer_id, victim_subkey), 15)
        # the price changed, still a valid float64 (last mantissa byte), signature kept
        i = signed.index(b"usd_per_hour\xcb") + len(b"usd_per_hour\xcb") + 7
        tampered = signed[:i] + bytes([signed[i] ^ 0x01]) + signed[i + 1 :]
        assert tampered != signed
        longer = min(expiration + 25, time.time() + FAST["max_ttl_s"] - 5)  # within the lifetime cap
        assert longer > expiration
        own = peer_record(attacker.identity.peer_id).to_wire()
        for node in (boot, member):
            # control: a record signed by its own owner with that same expiry is taken (so the refusals
            # below are the signature check at work, not the lifetime cap or a stale expiry)
            assert attacker.raw_store(node.peer_id, KEY, *attacker.signed(KEY, attacker.owner_subkey, own, longer), longer)
            assert not attacker.raw_store(node.peer_id, KEY, sub, tampered, longer), "tampered record accepted"
            assert not attacker.raw_store(node.peer_id, KEY, sub, signed, longer), "longer-expiry replay accepted"
        for reader in (boot, member):
            assert reader.get_peers()[member.peer_id] == honest
    finally:
        hb.stop()
        attacker.close()


def _stored_or_none(attacker: RawClient, node_id: str, owner_subkey: bytes) -> tuple[bytes, bytes, float] | None:
    try:
        return _stored(attacker, node_id, owner_subkey)
    except AssertionError:
        return None
