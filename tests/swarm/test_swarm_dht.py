"""Swarm nodes on loopback: records refused for each defect, heartbeats, bootstrap failures."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from geotrain.errors import BootstrapError, RecordError
from geotrain.swarm import JobRecord, LinkMeasurement, LinkRow, PeerRecord, ProgressRecord, Swarm, SwarmConfig
from geotrain.swarm.records import MemberProgress, PeerStatus, RegionDigest

from .helpers import RawClient, dead_maddr, nested_list_value, nested_tuple_bytes, wait_until

pytestmark = pytest.mark.multiprocess  # each Swarm runs a DHT process and a p2pd

FAST = dict(rpc_timeout_s=2.0, timeout_s=15.0, heartbeat_s=1.0, record_ttl_s=30.0, max_ttl_s=60.0)


def peer_record(peer_id: str, **changes: object) -> PeerRecord:
    now = time.time()
    fields: dict[str, object] = dict(
        peer_id=peer_id, region="eu-west", device="cpu", flops=1e9, memory_bytes=2**30, usd_per_hour=0.5,
        endpoint="tcp://127.0.0.1:5555", version="0.1", started_at=now, heartbeat_at=now,
    )  # fmt: skip
    fields.update(changes)
    return PeerRecord(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Swarm, Swarm]]:
    """A bootstrap node and one member, both geotrain nodes with validators."""
    boot = Swarm(SwarmConfig(**FAST)).start()  # type: ignore[arg-type]
    try:
        member = Swarm(SwarmConfig(initial_peers=tuple(boot.visible_maddrs()), **FAST)).start()  # type: ignore[arg-type]
        try:
            yield boot, member
        finally:
            member.shutdown()
    finally:
        boot.shutdown()


def test_publish_and_read_every_kind(pair: tuple[Swarm, Swarm]) -> None:
    boot, member = pair
    now = time.time()
    assert member.publish_peer(peer_record(member.peer_id, region="us-east"))
    row = LinkRow(
        src=member.peer_id,
        links={boot.peer_id: LinkMeasurement(bandwidth_bps=1.25e8, rtt_s=0.002, measured_at=now)},
    )
    assert member.publish_links(row)
    assert boot.publish_job(JobRecord(job_id="j1", spec={"steps": 10}, published_at=now))
    peers = wait_until(lambda: boot.get_peers(), 15)
    assert peers[member.peer_id].region == "us-east"
    assert wait_until(lambda: member.get_links(), 15)[member.peer_id] == row
    assert wait_until(lambda: member.get_jobs(), 15)[boot.peer_id].spec == {"steps": 10}
    with pytest.raises(RecordError, match="not this peer's id"):
        member.publish_peer(peer_record(boot.peer_id))  # a peer cannot publish in another's name
    line = MemberProgress(plan_version=1, step=4, round=0, tokens=64, status=PeerStatus.TRAINING, updated_at=now)
    digest = RegionDigest(collector=member.peer_id, job_id="j1", plan_version=1, region="us-east", updated_at=now,
                          members={member.peer_id: line, boot.peer_id: line})
    assert member.publish_digest(digest, ttl_s=30.0)
    assert wait_until(lambda: boot.get_digests(), 15)[member.peer_id] == digest
    with pytest.raises(RecordError, match="not this peer's id"):
        boot.publish_digest(digest, ttl_s=30.0)  # nor collect in another's name


def test_an_ephemeral_identity_leaves_no_key_on_disk_once_started(
    pair: tuple[Swarm, Swarm], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """p2pd reads a peer's minted key at start; the file goes then, so a peer killed later leaves none."""
    boot, _ = pair
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    node = Swarm(SwarmConfig(initial_peers=tuple(boot.visible_maddrs()), **FAST)).start()  # type: ignore[arg-type]
    try:
        assert not [p for p in tmp_path.iterdir() if p.name.startswith("geotrain-id-")]
        # the node still runs on that key (no peer record: the module's other tests count the peers)
        assert node.visible_maddrs() and node.peer_id
    finally:
        node.shutdown()


def test_each_defective_record_is_refused_and_the_honest_one_still_reads(pair: tuple[Swarm, Swarm]) -> None:
    boot, member = pair
    honest = peer_record(member.peer_id, usd_per_hour=1.25)
    # keep the honest record alive through the attacks (its TTL is 3 heartbeats and an RPC timeout = 5 s)
    hb = member.start_heartbeat(lambda: honest)
    assert hb.wait_first(15)
    key = "geotrain_peers"
    attacker = RawClient(boot.visible_maddrs())
    try:
        soon = time.time() + 20
        victim_subkey = b"[owner:" + member.identity.owner_public_key() + b"]"
        mine = attacker.owner_subkey
        own_record = peer_record(attacker.identity.peer_id).to_wire()

        # a record of the attacker's own, correctly formed: accepted (the channel works)
        assert attacker.raw_store(boot.peer_id, key, *attacker.signed(key, mine, own_record, soon), soon)

        # forged: the victim's subkey, a lower price, signed with the attacker's key
        sub, val = attacker.signed(key, mine, {**honest.to_wire(), "usd_per_hour": 0.0}, soon)
        forged_sub = attacker.signed(key, victim_subkey, b"", soon)[0]
        attacks = {
            "forged signature": (forged_sub, val),
            "schema violation": attacker.signed(key, mine, {**own_record, "flops": "fast"}, soon),
            "over-nested value": attacker.signed(
                "geotrain_job",
                mine,
                {"job_id": "j", "spec": {"x": nested_list_value(30)}, "published_at": 1.0},
                soon,
            ),
            "crash-level tuple nesting": attacker.signed(key, mine, nested_tuple_bytes(400), soon),
            "oversized value": attacker.signed(key, mine, {**own_record, "device": "x" * 600_000}, soon),
        }
        for name, (sub, val) in attacks.items():
            store_key = "geotrain_job" if name == "over-nested value" else key
            for node in (boot, member):
                assert not attacker.raw_store(node.peer_id, store_key, sub, val, soon), (
                    f"{name} accepted by a node"
                )
        far = time.time() + 10 * 365 * 86400
        sub, val = attacker.signed(key, mine, own_record, far)
        for node in (boot, member):
            assert not attacker.raw_store(node.peer_id, key, sub, val, far), (
                "a 10-year expiration was accepted"
            )
        assert boot.started and member.started  # nobody crashed
        for reader in (boot, member):
            peers = reader.get_peers()
            assert peers[member.peer_id] == honest
            assert peers[attacker.identity.peer_id].flops == 1e9  # the attacker's well-formed record
            assert set(peers) == {member.peer_id, attacker.identity.peer_id}
            assert attacker.identity.peer_id not in reader.get_jobs()
    finally:
        hb.stop()
        attacker.close()


def test_heartbeat_keeps_a_peer_alive_and_it_vanishes_within_three_periods(pair: tuple[Swarm, Swarm]) -> None:
    boot, _ = pair
    period = 1.0
    publisher = Swarm(SwarmConfig(initial_peers=tuple(boot.visible_maddrs()), **FAST)).start()  # type: ignore[arg-type]
    try:
        base = peer_record(publisher.peer_id, region="ap-south")
        hb = publisher.start_heartbeat(lambda: base.model_copy(update={"heartbeat_at": time.time()}))
        assert hb.wait_first(15)
        first = wait_until(lambda: boot.get_peers().get(publisher.peer_id), 15)
        # a record outlives one TTL (3 periods and an RPC timeout) only if it is refreshed: wait for a much later heartbeat
        later = wait_until(
            lambda: (
                (r := boot.get_peers().get(publisher.peer_id))
                and r.heartbeat_at > first.heartbeat_at + 3.5 * period
                and r
            ),
            20,
        )
    finally:
        publisher.shutdown()
    stopped = time.time()
    assert not hb.alive
    last_beat = later.heartbeat_at
    wait_until(lambda: publisher.peer_id not in boot.get_peers(), publisher.config.peer_ttl_s + 10)
    gone = time.time()
    # expiry = last heartbeat + 3 periods + one RPC timeout; allow the poll interval and one in-flight beat
    ttl = publisher.config.peer_ttl_s
    assert ttl == 3 * period + FAST["rpc_timeout_s"]
    assert gone - last_beat <= ttl + period + 1.5, (gone - last_beat, gone - stopped)


def test_bootstrap_failure_is_fast_and_clear_and_a_live_second_peer_is_enough(
    pair: tuple[Swarm, Swarm],
) -> None:
    boot, _ = pair
    t = time.monotonic()
    with pytest.raises(BootstrapError, match="none of the initial peers answered"):
        Swarm(SwarmConfig(initial_peers=(dead_maddr(), dead_maddr()), **FAST)).start()  # type: ignore[arg-type]
    assert time.monotonic() - t < 30
    joined = Swarm(SwarmConfig(initial_peers=(dead_maddr(), *boot.visible_maddrs()), **FAST)).start()  # type: ignore[arg-type]
    try:
        assert joined.publish_peer(peer_record(joined.peer_id))
        assert joined.peer_id in wait_until(lambda: boot.get_peers(), 15)
    finally:
        joined.shutdown()


def test_a_quick_read_returns_the_swarms_records_not_this_nodes_own_last_write() -> None:
    """A client-mode node stores no replica: its quick read (one replica's copy) must come from the swarm.

    (hivemind caches a node's own writes: a quick read would then return that one record as the whole
    dictionary, and a peer would see a swarm of itself.)
    """
    boot = Swarm(SwarmConfig(**FAST)).start()  # type: ignore[arg-type]
    member = Swarm(SwarmConfig(initial_peers=tuple(boot.visible_maddrs()), **FAST)).start()  # type: ignore[arg-type]
    client = Swarm(SwarmConfig(initial_peers=tuple(boot.visible_maddrs()), client_mode=True, **FAST)).start()  # type: ignore[arg-type]
    try:
        # progress records (30 s of lifetime here): a peer record lives 3 heartbeats of 1 s and an RPC timeout, which a loaded
        # machine can spend between the two writes and the read
        def progress(peer_id: str) -> ProgressRecord:
            return ProgressRecord(
                peer_id=peer_id, job_id="quick", plan_version=1, step=1, tokens=0, round=0,
                bytes_sent=0, bytes_received=0, updated_at=time.time(),
            )  # fmt: skip

        assert member.publish_progress(progress(member.peer_id))
        assert client.publish_progress(progress(client.peer_id))
        quick = client.get_progress(thorough=False)
        assert {member.peer_id, client.peer_id} <= set(quick), sorted(quick)
        # one replica's copy: it may lack a record, never add one
        assert set(quick) <= set(client.get_progress())
    finally:
        client.shutdown()
        member.shutdown()
        boot.shutdown()


_DEAD_DHT_CHILD = textwrap.dedent(
    """
    import json, os, signal, time
    from geotrain.errors import SwarmError
    from geotrain.swarm import Swarm, SwarmConfig

    FAST = dict(rpc_timeout_s=2.0, timeout_s=15.0, heartbeat_s=1.0, record_ttl_s=30.0, max_ttl_s=60.0)
    boot = Swarm(SwarmConfig(**FAST)).start()
    swarm = Swarm(SwarmConfig(initial_peers=tuple(boot.visible_maddrs()), **FAST)).start()
    try:
        os.kill(swarm.dht_pid, signal.SIGKILL)
        t = time.monotonic()
        try:
            swarm.get_peers()
            error = None
        except SwarmError as e:
            error = str(e)
        waited = time.monotonic() - t
        p2pd = swarm.p2pd_pid
        orphaned = p2pd is not None and os.path.exists(f"/proc/{p2pd}")
    finally:
        swarm.shutdown()
        boot.shutdown()
    print(json.dumps(dict(error=error, waited=waited, p2pd=p2pd, orphaned=orphaned)))
    """
)


def test_a_dead_dht_process_is_reported_at_once() -> None:
    """A SIGKILLed DHT process is an error at the next call, not after the DHT deadline.

    It runs in a child interpreter: every DHT forked after this test in the same process once failed
    to report ready, so nothing it kills may share the suite's process.
    """
    out = subprocess.run([sys.executable, "-c", _DEAD_DHT_CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["error"] is not None and "DHT process died" in seen["error"], seen
    assert seen["waited"] < 5, seen  # not the 15 s DHT deadline
    assert seen["orphaned"], seen  # its p2pd outlived the SIGKILL ...
    wait_until(lambda: not _running(seen["p2pd"]), 10)  # ... and shutdown() still stopped it


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
