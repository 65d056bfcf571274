"""Peer-held checkpoints (geotrain.peers.statestore) and the coordinator's manifests (geotrain.coordinator.manifest)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from geotrain.config import job_from_dict
from geotrain.coordinator.manifest import ManifestBook, latest_manifest, write_manifest
from geotrain.errors import ConfigError
from geotrain.peers import checkpoint
from geotrain.peers.state import StageState, digest
from geotrain.peers.statestore import Shard, StateStore


def state(step: int, start: int = 0, end: int = 4, job: str = "job") -> StageState:
    g = torch.Generator().manual_seed(step)
    params = {f"blocks.{b}.w": torch.randn(3, 5, generator=g) for b in range(start, end)}
    momentum = {f"blocks.{b}.w": torch.randn(3, 5, generator=g) for b in range(start, end)}
    return StageState(job, round=step // 5, step=step, params=params, momentum=momentum)


def test_background_write_then_verified_load_is_bitwise(tmp_path: Path) -> None:
    store = StateStore(tmp_path, keep=2)
    st = state(10)
    store.submit(st, [(0, 2), (2, 4)])
    assert store.flush(60)
    got = store.load("job", 10, 0, 4)
    assert got is not None and got.round == 2 and got.step == 10
    assert digest(got.params) == digest(st.params) and digest(got.momentum) == digest(st.momentum)
    part = store.load("job", 10, 1, 3)  # only the blocks asked for, from both shards
    assert part is not None and sorted(part.params) == ["blocks.1.w", "blocks.2.w"]
    shards = store.written("job")
    assert [(s.start, s.end, s.step, s.round) for s in shards] == [(0, 2, 10, 2), (2, 4, 10, 2)]
    assert Shard.from_wire("job", shards[0].to_wire()).sha256 == shards[0].sha256
    assert store.bytes_written == sum(s.nbytes for s in shards) and store.write_s > 0
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
    pt, js = d / "b2-4.pt", d / "b2-4.json"
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
    book.add("peer-a", 1, [s.to_wire() for s in a])
    assert book.changed() == []  # blocks 2-3 have no holder yet
    book.add("peer-b", 1, [s.to_wire() for s in b] + ["not a shard"])
    (m,) = book.changed()
    assert (m.step, m.round, m.plan_version) == (10, 2, 1)
    assert m.holders_of(0, 2) == ["peer-a"] and m.holders_of(0, 4) == ["peer-a", "peer-b"]
    book.written(m)
    assert book.changed() == []
    write_manifest(tmp_path / "report", m)
    assert latest_manifest(tmp_path / "report", "job", 4) == m
    assert latest_manifest(tmp_path / "report", "other", 4) is None
    assert latest_manifest(tmp_path / "report", "job", 5) is None  # does not cover a 5-block model


def test_checkpoint_section_keys() -> None:
    ck = job_from_dict({"checkpoint": {"keep": 3, "allow_seed_restart": True}}).checkpoint
    assert ck.keep == 3 and ck.allow_seed_restart and ck.every_rounds == 1
    assert job_from_dict({}).checkpoint.keep == 2
    with pytest.raises(ConfigError):
        job_from_dict({"checkpoint": {"keep": 0}})
