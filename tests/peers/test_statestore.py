"""Peer-held checkpoints (geotrain.peers.statestore) and the coordinator's manifests (geotrain.coordinator.manifest)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest
import torch

from geotrain.config import job_from_dict
from geotrain.coordinator.manifest import ManifestBook, countable_shards, latest_manifest, write_manifest
from geotrain.errors import ConfigError
from geotrain.peers import checkpoint
from geotrain.peers.remote import RemoteStore
from geotrain.peers.statestore import Shard, StateStore
from geotrain.swarm.records import ProgressRecord
from geotrain.sync.state import StageState, digest
from tests.swarm.test_records import chain, make_record, owner  # noqa: F401 (fixtures)


def state(step: int, start: int = 0, end: int = 4, job: str = "job", *, local: bool = False) -> StageState:
    g = torch.Generator().manual_seed(step)
    params = {f"blocks.{b}.w": torch.randn(3, 5, generator=g) for b in range(start, end)}
    momentum = {f"blocks.{b}.w": torch.randn(3, 5, generator=g) for b in range(start, end)}
    extra: dict[str, torch.Tensor] = {}
    if local:  # what a worker's local_state() holds: residuals per group (two groups here) and AdamW moments
        for a, b in ((start, (start + end) // 2), ((start + end) // 2, end)):
            extra[f"e:{a}-{b}:member:0"] = torch.randn(15 * (b - a), generator=g)
            extra[f"e:{a}-{b}:owner:0"] = torch.randn(15 * (b - a), generator=g)
        for n in params:
            extra[f"a:{n}:exp_avg"] = torch.randn(3, 5, generator=g)
            extra[f"a:{n}:exp_avg_sq"] = torch.rand(3, 5, generator=g)
            extra[f"a:{n}:step"] = torch.tensor(float(step))
    return StageState(job, round=step // 5, step=step, params=params, momentum=momentum, local=extra,
                      slot=(1, 2, 0) if local else None)


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Bitwise equal: same names, dtypes, shapes and bytes."""
    return sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_background_write_then_verified_load_is_bitwise(tmp_path: Path) -> None:
    store = StateStore(tmp_path, keep=2)
    st = state(10)
    store.submit(st, [(0, 2), (2, 4)])
    assert store.flush(60)
    files = sorted(p.name for p in checkpoint.step_dir(store.job_dir("job"), 10).iterdir())
    assert files == ["b0-2.json", "b0-2.safetensors", "b2-4.json", "b2-4.safetensors"]  # no pickle on disk
    got = store.load("job", 10, 0, 4)
    assert got is not None and got.round == 2 and got.step == 10
    assert digest(got.params) == digest(st.params) and digest(got.momentum) == digest(st.momentum)
    part = store.load("job", 10, 1, 3)  # only the blocks asked for, from both shards
    assert part is not None and sorted(part.params) == ["blocks.1.w", "blocks.2.w"]
    shards = store.written("job")
    assert [(s.start, s.end, s.step, s.round) for s in shards] == [(0, 2, 10, 2), (2, 4, 10, 2)]
    assert Shard.from_report("job", shards[0].report()) == dataclasses.replace(shards[0], nbytes=0)
    assert store.bytes_written == sum(s.nbytes for s in shards) and store.write_s > 0
    assert store.submit_wait_s >= 0 and store.failures == 0
    assert store.load("job", 15, 0, 4) is None and store.load("other", 10, 0, 4) is None
    store.close()


def test_keeps_the_last_k_steps(tmp_path: Path) -> None:
    store = StateStore(tmp_path, keep=2)
    for step in (5, 10, 15):
        store.save(state(step), [(0, 4)])
    assert store.steps("job") == [15, 10]


@pytest.mark.parametrize("damage", ["truncated", "flipped", "other_job", "other_step", "manifest_digest"])
def test_a_damaged_or_foreign_shard_is_refused_and_counted(tmp_path: Path, damage: str) -> None:
    store = StateStore(tmp_path, keep=2)
    store.save(state(10), [(0, 2), (2, 4)])
    d = checkpoint.step_dir(store.job_dir("job"), 10)
    pt, js = d / "b2-4.safetensors", d / "b2-4.json"
    expect = None
    if damage == "truncated":
        pt.write_bytes(pt.read_bytes()[:-50])
    elif damage == "flipped":
        data = bytearray(pt.read_bytes())
        data[len(data) // 2] ^= 0xFF
        pt.write_bytes(bytes(data))
    elif damage in ("other_job", "other_step"):
        m = json.loads(js.read_text())
        m["job_id" if damage == "other_job" else "step"] = "job2" if damage == "other_job" else 20
        js.write_text(json.dumps(m))
    else:
        expect = {(2, 4): "0" * 64}
    got = store.load("job", 10, 0, 4, expect=expect)
    assert store.refused == 1
    assert got is not None and sorted(got.params) == ["blocks.0.w", "blocks.1.w"]  # the sound shard only
    assert store.load("job", 10, 2, 4, expect=expect) is None


def test_manifest_written_once_every_block_is_covered(tmp_path: Path) -> None:
    book = ManifestBook("job", num_blocks=4)
    a = StateStore(tmp_path / "a").save(state(10, 0, 2), [(0, 2)])
    b = StateStore(tmp_path / "b").save(state(10, 2, 4), [(2, 4)])
    book.add("peer-a", 1, [s.report() for s in a])
    assert book.changed() == [] and book.newest() is None  # blocks 2-3 have no holder yet
    book.add("peer-b", 1, [s.report() for s in b])
    (m,) = book.changed()
    assert book.newest() == m
    assert (m.step, m.round, m.plan_version) == (10, 2, 1)
    assert m.holders_of(0, 2) == ["peer-a"] and m.holders_of(0, 4) == ["peer-a", "peer-b"]
    book.written(m)
    assert book.changed() == []
    write_manifest(tmp_path / "report", m)
    assert latest_manifest(tmp_path / "report", "job", 4) == m
    assert latest_manifest(tmp_path / "report", "other", 4) is None
    assert latest_manifest(tmp_path / "report", "job", 5) is None  # does not cover a 5-block model


def test_a_peer_outside_the_plan_or_behind_it_adds_no_checkpoint_past_the_plans_start(tmp_path: Path) -> None:
    # a peer a replan made a spare trained on under the old plan until it heard of the new one: its shards
    # past the new plan's start are of the old trajectory, and a manifest of them would be a fork of the job
    shards = [s.report() for step in (10, 20, 30) for s in StateStore(tmp_path / str(step)).save(state(step), [(0, 4)])]
    steps = lambda got: [s.step for s in got]  # noqa: E731
    assert steps(countable_shards(shards, placed=True, current=True, start_step=20)) == [10, 20, 30]
    assert steps(countable_shards(shards, placed=False, current=True, start_step=20)) == [10, 20]  # a spare
    assert steps(countable_shards(shards, placed=True, current=False, start_step=20)) == [10, 20]  # an old plan's
    book = ManifestBook("job", num_blocks=4)
    book.add("spare", 2, countable_shards(shards, placed=False, current=True, start_step=20))
    assert book.newest() is not None and book.newest().step == 20


def test_pruning_keeps_the_newest_writes_not_the_highest_steps(tmp_path: Path) -> None:
    # a replan restarts the step count below what the weights have seen: the new plan's first checkpoints
    # (steps 835, 840) are newer in the job's lineage than the old plan's 995 and 1000, and must be kept
    store = StateStore(tmp_path, keep=2)
    for step in (995, 1000):
        store.save(state(step), [(0, 4)])
    store.save(state(835), [(0, 4)])
    assert store.recent("job") == [835, 1000] and sorted(store.steps("job")) == [835, 1000]
    store.save(state(840), [(0, 4)])
    assert store.recent("job") == [840, 835] and sorted(store.steps("job")) == [835, 840]
    assert sorted(sh.step for sh in store.held("job")) == [835, 840]
    # a restarted peer's scan keeps the same two, by the write times its sidecars record
    again = StateStore(tmp_path, keep=2)
    assert sorted(sh.step for sh in again.held("job")) == [835, 840]
    assert again.load("job", 840, 0, 4) is not None
    # a sidecar that is not JSON does not keep its step out of the order (nor on disk for ever)
    (tmp_path / "job" / "step-000835" / "b0-4.json").write_text("{not json")
    store.save(state(845), [(0, 4)])
    assert sorted(store.steps("job")) == [840, 845]


def test_checkpoint_section_keys() -> None:
    ck = job_from_dict({"checkpoint": {"keep": 3, "allow_seed_restart": True}}).checkpoint
    assert ck.keep == 3 and ck.allow_seed_restart and ck.every_rounds == 1
    assert job_from_dict({}).checkpoint.keep == 2
    with pytest.raises(ConfigError):
        job_from_dict({"checkpoint": {"keep": 0}})


def test_local_state_round_trips_bitwise(tmp_path: Path) -> None:
    """Residuals and inner optimizer moments come back bitwise, with the slot they belong to; never to others."""
    st = state(10, local=True)
    store = StateStore(tmp_path)
    store.save(st, [(0, 2), (2, 4)])
    got = store.load("job", 10, 0, 4)
    assert got is not None and got.slot == (1, 2, 0)
    assert same(got.params, st.params) and same(got.momentum, st.momentum) and same(got.local, st.local)
    half = store.load("job", 10, 2, 4)  # one group's shard: its residuals and its parameters' moments only
    assert half is not None and sorted(half.local) == sorted(k for k in st.local if "blocks.3" in k or "blocks.2" in k
                                                             or k.startswith("e:2-4:"))
    # a piece of another slot never mixes with it (two trajectories), and the wire form carries none of it
    other = dataclasses.replace(state(10, 4, 6, local=True), slot=(0, 2, 1))
    assert got.merge(other).local == {} and got.without_local().local == {}


def test_held_reports_what_a_restarted_peer_finds_on_disk(tmp_path: Path) -> None:
    """A fresh store on an old directory reports the verified shards there (a damaged one is refused)."""
    StateStore(tmp_path).save(state(5), [(0, 2), (2, 4)])
    StateStore(tmp_path).save(state(10), [(0, 2), (2, 4)])
    d = checkpoint.step_dir(tmp_path / "job", 5)
    (d / "b2-4.safetensors").write_bytes(b"garbage")
    fresh = StateStore(tmp_path)
    held = fresh.held("job")
    assert [(s.step, s.start, s.end) for s in held] == [(10, 0, 2), (10, 2, 4), (5, 0, 2)]
    assert fresh.refused == 1 and [(s.step, s.start) for s in fresh.written("job")] == [(10, 0), (10, 2)]
    fresh.save(state(15), [(0, 2)])  # keep=2: step 5 is pruned from the disk and from what is reported
    assert [(s.step, s.start) for s in fresh.held("job")] == [(15, 0), (10, 0), (10, 2)]
    late = StateStore(tmp_path)  # a write before the first report does not hide what was on disk already
    late.save(state(20), [(2, 4)])
    assert [(s.step, s.start) for s in late.held("job")] == [(20, 2), (15, 0)]


def test_progress_record_carries_typed_shards_and_reads_older_ones() -> None:
    base = {"peer_id": "p", "job_id": "job", "plan_version": 1, "step": 10, "tokens": 0, "round": 2,
            "bytes_sent": 0, "bytes_received": 0, "updated_at": 1.0}
    sha = "ab" * 32
    old = ProgressRecord.model_validate({**base, "stats": {"status": 0.0, f"shard:2:10:0-3:{sha}": 10.0, "x": 1.0}})
    assert [(s.round, s.step, s.start, s.end, s.sha256) for s in old.shards] == [(2, 10, 0, 3, sha)]
    assert old.stats == {"x": 1.0}
    assert ProgressRecord.model_validate(old.to_wire()) == old
    with pytest.raises(ValueError):
        ProgressRecord.model_validate({**base, "shards": [{"round": 2, "step": 10, "start": 3, "end": 3,
                                                           "sha256": sha}]})
    with pytest.raises(ValueError):
        ProgressRecord.model_validate({**base, "stats": {"shard:2:10:0-3:nothex": 1.0}})


def test_every_version_of_a_progress_record_passes_the_dht_validators(owner, chain) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """New (links measured by traffic), the version before (typed shards), the one before it (typed status,
    shards as stats keys) and the oldest (neither)."""
    sha = "cd" * 32
    new = ProgressRecord(peer_id=owner.peer_id, job_id="job", plan_version=1, step=10, tokens=0, round=2,
                         bytes_sent=0, bytes_received=0, updated_at=time.time(),
                         shards=[Shard("job", 2, 10, 0, 3, sha, 0).report()],
                         links_in={owner.peer_id: {"bandwidth_bps": 1e4, "messages": 12, "queued": 9}}).to_wire()
    before = {k: v for k, v in new.items() if k != "links_in"}
    between = {k: v for k, v in before.items() if k != "shards"}
    between["stats"] = {f"shard:2:10:0-3:{sha}": 10.0}
    oldest = {k: v for k, v in between.items() if k != "status"}
    oldest["stats"] = {**between["stats"], "status": 0.0}
    for wire in (new, before, between, oldest):
        assert chain.validate(make_record(owner, "progress", wire, signer=chain)), wire
        assert [s.sha256 for s in ProgressRecord.model_validate(wire, strict=True).shards] == [sha]


def test_remote_upload_and_verified_load(tmp_path: Path) -> None:
    """The leader's shards go to the remote off the caller's thread; a reader verifies them like local ones."""
    url = f"file://{tmp_path / 'remote'}"
    writer = StateStore(tmp_path / "a", keep=2, remote=RemoteStore(url))
    st = state(10, local=True)
    writer.submit(st, [(0, 2), (2, 4)], upload=[(2, 4)])
    assert writer.flush(60) and writer.upload_failures == 0 and writer.bytes_uploaded > 0
    reader = StateStore(tmp_path / "b", remote=RemoteStore(url))
    assert reader.load("job", 10, 0, 4) is None  # nothing of its own
    got = reader.load_remote("job", 10, 0, 4)
    assert got is not None and sorted(got.params) == ["blocks.2.w", "blocks.3.w"]  # only the uploaded range
    assert same(got.params, st.select(2, 4).params) and same(got.momentum, st.select(2, 4).momentum)
    assert got.local == {} and got.slot is None  # the leader's local state is its own
    for step in (15, 20):
        writer.save(state(step), [(2, 4)], upload=[(2, 4)])
    assert sorted(p.name for p in (tmp_path / "remote" / "job").iterdir()) == ["step-000015", "step-000020"]
    shard = tmp_path / "remote" / "job" / "step-000020" / "b2-4.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    assert reader.load_remote("job", 20, 0, 4) is None and reader.refused == 1
    assert StateStore(tmp_path / "c").load_remote("job", 15, 0, 4) is None  # no remote configured


def test_the_remote_keeps_the_newest_writes_too(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'remote'}"
    writer = StateStore(tmp_path / "a", keep=2, remote=RemoteStore(url))
    for step in (995, 1000, 835):  # 835: the first checkpoint of a plan that restarted below the old steps
        writer.save(state(step), [(0, 4)], upload=[(0, 4)])
    assert sorted(p.name for p in (tmp_path / "remote" / "job").iterdir()) == ["step-000835", "step-001000"]


@pytest.mark.parametrize("url", ["nope", "foo://bucket/x", "file://relative/dir", "file://", "s3://"])
def test_checkpoint_remote_url_is_checked(url: str) -> None:
    with pytest.raises(ConfigError, match="checkpoint.remote"):
        job_from_dict({"checkpoint": {"remote": url}})
    assert job_from_dict({"checkpoint": {"remote": "file:///srv/ckpt"}}).checkpoint.remote == "file:///srv/ckpt"
