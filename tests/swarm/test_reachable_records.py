"""The peer record's newer fields (advertised endpoints, reachability) and old records without them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from geotrain.swarm.identity import Identity
from geotrain.swarm.records import DIAL_BACK, PeerRecord
from tests.swarm.test_records import chain, make_record, owner, peer_record  # noqa: F401 (fixtures)


def test_new_fields_round_trip_the_validator_chain(owner: Identity, chain) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from hivemind.utils import MSGPackSerializer

    for rec in (
        peer_record(owner.peer_id, endpoints=["tcp://203.0.113.7:4000", "tcp://[2001:db8::1]:4000"], reachable=True),
        peer_record(owner.peer_id, endpoint=DIAL_BACK, endpoints=["tcp://192.168.1.5:4000"], reachable=False),
    ):
        record = make_record(owner, "peers", rec.to_wire(), signer=chain)
        assert chain.validate(record)
        assert PeerRecord.model_validate(MSGPackSerializer.loads(chain.strip_value(record)), strict=True) == rec
    assert peer_record("p", endpoint=DIAL_BACK).dial_back and not peer_record("p").dial_back


def test_an_older_peers_record_still_passes_and_decodes(owner: Identity, chain) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    old = peer_record(owner.peer_id).to_wire()
    del old["endpoints"], old["reachable"], old["flops_bf16"]  # every field added since the first release
    record = make_record(owner, "peers", old, signer=chain)
    assert chain.validate(record)
    rec = PeerRecord.model_validate(old, strict=True)
    assert rec.endpoints == [] and rec.reachable is None
    half = {**old, "reachable": True}  # one new field without the other is no shape any version writes
    assert not chain.validate(make_record(owner, "peers", half, signer=chain))


def test_unspecified_or_malformed_advertised_endpoints_are_refused() -> None:
    for bad in (["tcp://0.0.0.0:1"], ["tcp://[::]:1"], ["udp://x:1"], [DIAL_BACK]):
        with pytest.raises(ValidationError):
            peer_record("p", endpoints=bad)
    with pytest.raises(ValidationError):
        peer_record("p", reachable="yes")
