"""Records, the derived hivemind schema, and the validator chain, without a network."""

from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

from geotrain.swarm.identity import Identity
from geotrain.swarm.records import (
    RECORD_KINDS,
    JobRecord,
    LinkMeasurement,
    LinkRow,
    MemberProgress,
    PeerRecord,
    PeerStatus,
    PlanRecord,
    ProgressRecord,
    RegionDigest,
)
from geotrain.swarm.schema import build_validators, dht_key


@pytest.fixture(scope="module")
def owner() -> Identity:
    return Identity.ephemeral()


@pytest.fixture(scope="module")
def chain(owner: Identity):  # type: ignore[no-untyped-def]
    from hivemind.dht.validation import CompositeValidator

    return CompositeValidator(
        build_validators(
            swarm="t",
            private_key=owner.hivemind_private_key(),
            max_value_bytes=8192,
            max_depth=8,
            max_ttl_s=60.0,
        )
    )


def peer_record(peer_id: str, **changes: object) -> PeerRecord:
    now = time.time()
    fields: dict[str, object] = dict(
        peer_id=peer_id, region="eu-west", device="cpu", flops=1e9, memory_bytes=2**30, usd_per_hour=0.5,
        endpoint="tcp://127.0.0.1:5555", version="0.1", started_at=now, heartbeat_at=now,
    )  # fmt: skip
    fields.update(changes)
    return PeerRecord(**fields)  # type: ignore[arg-type]


def make_record(owner: Identity, kind: str, value: object, *, ttl: float = 30.0, signer=None):  # type: ignore[no-untyped-def]
    """A signed DHTRecord exactly as DHTNode.store builds it."""
    from hivemind.dht.routing import DHTID
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils import MSGPackSerializer

    subkey = MSGPackSerializer.dumps(b"[owner:" + owner.owner_public_key() + b"]")
    key = DHTID.generate(source=dht_key("t", kind)).to_bytes()
    record = DHTRecord(key, subkey, MSGPackSerializer.dumps(value), time.time() + ttl)
    import dataclasses

    return dataclasses.replace(record, value=signer.sign_value(record))


def test_models_are_strict() -> None:
    with pytest.raises(ValidationError):
        peer_record("p", flops="1e9")  # no coercion from str
    with pytest.raises(ValidationError):
        peer_record("p", flops=-1.0)
    with pytest.raises(ValidationError, match="region"):
        peer_record("p", region="eu west!")
    with pytest.raises(ValidationError, match="endpoint"):
        peer_record("p", endpoint="http://x:1")
    with pytest.raises(ValidationError):
        PeerRecord.model_validate({**peer_record("p").to_wire(), "extra": 1})
    with pytest.raises(ValidationError):
        JobRecord(job_id="j", spec={"t": (1, 2)}, published_at=0.0)  # type: ignore[dict-item]
    with pytest.raises(ValidationError):
        ProgressRecord(
            peer_id="p", job_id="j", plan_version=1, step=1, loss=float("nan"), tokens=0, round=0,
            bytes_sent=0, bytes_received=0, updated_at=0.0,
        )  # fmt: skip
    assert peer_record("p", flops=3).flops == 3.0  # an int is an exact float; it is stored as a float


def test_honest_records_of_every_kind_pass_the_chain(owner: Identity, chain) -> None:  # type: ignore[no-untyped-def]
    now = time.time()
    values = {
        "peers": peer_record(owner.peer_id),
        "links": LinkRow(
            src=owner.peer_id, links={"QmX": LinkMeasurement(bandwidth_bps=1e8, rtt_s=0.01, measured_at=now)}
        ),
        "job": JobRecord(
            job_id="j", spec={"model": {"layers": 4}, "lr": 0.1, "tags": ["a"]}, published_at=now
        ),
        "plan": PlanRecord(job_id="j", version=2, plan={"stages": [[0, 2], [2, 4]]}, published_at=now),
        "progress": ProgressRecord(
            peer_id=owner.peer_id,
            job_id="j",
            plan_version=2,
            step=10,
            loss=2.5,
            tokens=1000,
            round=1,
            bytes_sent=5,
            bytes_received=6,
            updated_at=now,
            stats={"util": 0.9},
        ),  # fmt: skip
        "digest": RegionDigest(
            collector=owner.peer_id, job_id="j", plan_version=2, region="eu-west", updated_at=now,
            members={owner.peer_id: MemberProgress(plan_version=2, step=10, round=1, tokens=1000, loss=2.5,
                                                   status=PeerStatus.TRAINING, updated_at=now, shard_step=8),
                     "QmX": MemberProgress(plan_version=2, step=9, round=1, tokens=0, status=PeerStatus.IDLE,
                                           updated_at=now)},
        ),
    }
    assert set(values) == set(RECORD_KINDS)
    from hivemind.utils import MSGPackSerializer

    for kind, model in values.items():
        record = make_record(owner, kind, model.to_wire(), signer=chain)
        assert chain.validate(record), kind
        decoded = MSGPackSerializer.loads(chain.strip_value(record))
        assert type(model).model_validate(decoded, strict=True) == model


def test_each_defect_is_refused(owner: Identity, chain) -> None:  # type: ignore[no-untyped-def]
    import dataclasses

    honest = peer_record(owner.peer_id).to_wire()
    assert chain.validate(make_record(owner, "peers", honest, signer=chain))

    # forged: signed by someone else's key while claiming the owner's subkey
    other = Identity.ephemeral()
    from hivemind.dht.crypto import RSASignatureValidator

    forger = RSASignatureValidator(other.hivemind_private_key())
    unsigned = make_record(owner, "peers", honest, signer=_NoSign())
    forged = dataclasses.replace(
        unsigned, value=unsigned.value + b"[signature:" + other.hivemind_private_key().sign(b"x") + b"]"
    )
    assert not chain.validate(forged)
    assert not chain.validate(unsigned)
    assert forger.sign_value(unsigned) == unsigned.value  # a foreign key does not even try to sign it

    # tampered after signing
    good = make_record(owner, "peers", honest, signer=chain)
    from hivemind.utils import MSGPackSerializer

    tampered_value = good.value.replace(
        MSGPackSerializer.dumps(honest), MSGPackSerializer.dumps({**honest, "usd_per_hour": 0.0})
    )
    assert tampered_value != good.value
    assert not chain.validate(dataclasses.replace(good, value=tampered_value))

    # schema violations: wrong type, missing field, extra field
    assert not chain.validate(make_record(owner, "peers", {**honest, "flops": "fast"}, signer=chain))
    assert not chain.validate(
        make_record(owner, "peers", {k: v for k, v in honest.items() if k != "region"}, signer=chain)
    )
    assert not chain.validate(make_record(owner, "peers", {**honest, "admin": True}, signer=chain))
    assert not chain.validate(make_record(owner, "peers", {**honest, "memory_bytes": 1.5}, signer=chain))

    # lifetime beyond max_ttl (60 s)
    assert not chain.validate(make_record(owner, "peers", honest, ttl=3600 * 24 * 365, signer=chain))

    # too deep (max_depth 8) and too large (8192 bytes): refused before anything decodes them
    deep: object = 1
    for _ in range(20):
        deep = [deep]
    assert not chain.validate(
        make_record(owner, "job", {"job_id": "j", "spec": {"x": deep}, "published_at": 1.0}, signer=chain)
    )
    assert not chain.validate(make_record(owner, "peers", {**honest, "device": "x" * 9000}, signer=chain))

    # a digest line of the wrong shape, or with a status no version knows
    line = {"plan_version": 1, "step": 1, "round": 0, "tokens": 0, "loss": None, "status": "training",
            "updated_at": 1.0, "shard_step": None, "links": 0, "lost": False}
    digest = {"collector": owner.peer_id, "job_id": "j", "plan_version": 1, "region": "eu-west", "updated_at": 1.0}
    assert chain.validate(make_record(owner, "digest", {**digest, "members": {"QmA": line}}, signer=chain))
    assert not chain.validate(make_record(owner, "digest", {**digest, "members": {"QmA": {**line, "step": "1"}}},
                                          signer=chain))
    assert not chain.validate(make_record(owner, "digest", {**digest, "members": {"QmA": {**line, "status": "boss"}}},
                                          signer=chain))

    # after all that, the honest record still validates
    assert chain.validate(make_record(owner, "peers", honest, signer=chain))


class _NoSign:
    def sign_value(self, record):  # type: ignore[no-untyped-def]
        return record.value


def test_v1_schema_covers_every_field() -> None:
    from geotrain.swarm.records import MODEL_OF_KIND
    from geotrain.swarm.schema import v1_model

    for model in MODEL_OF_KIND.values():
        assert set(v1_model(model).__fields__) == set(model.model_fields)


def test_dht_key_rejects_unknown_kind() -> None:
    assert dht_key("geotrain", "peers") == "geotrain_peers"
    with pytest.raises(ValueError, match="unknown record kind"):
        dht_key("geotrain", "secrets")
