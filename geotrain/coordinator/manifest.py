"""Checkpoint manifests: which peers hold which blocks of a checkpoint round, and each shard's SHA-256.

What is a manifest? The coordinator's whole record of one peer-held
checkpoint (:mod:`geotrain.peers.statestore`): job id, plan version, round,
step, and for each block range the peers that wrote a shard of it with the
SHA-256 of each shard. Peers report the shards they hold in their progress
records (the typed ``ProgressRecord.shards``, :class:`~geotrain.swarm.records.ShardReport`; an older
peer's ``stats`` keys ``shard:...`` decode to the same); a step's manifest is written once the
reported shards cover every block of the model, and rewritten when a holder is
added or a shard changes (the final checkpoint after a flushed round). Peers report what their
state directories hold before any plan too, so a coordinator that finds no manifest (its report
directory gone, the DHT's copy lost with the nodes that stored it) rebuilds one from the live holders.

It is the only thing a coordinator keeps on its disk for a job's state:
``<report dir>/manifests/step-NNNNNN.json``, written atomically. A fresh
coordinator started with ``--resume`` reads the newest complete one
(:func:`latest_manifest`) and plans from its step; the tensors stay with the peers.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geotrain.errors import CheckpointError
from geotrain.peers.checkpoint import _atomic_write
from geotrain.peers.statestore import Shard
from geotrain.swarm.records import ShardReport

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^step-(\d{6,})\.json$")


@dataclass(frozen=True)
class ShardHolders:
    """Blocks ``[start, end)``: the peers holding a shard of them, with each one's SHA-256."""

    start: int
    end: int
    sha256: tuple[tuple[str, str], ...]  # (peer id, digest), by peer id

    @property
    def holders(self) -> list[str]:
        return [p for p, _ in self.sha256]


@dataclass(frozen=True)
class Manifest:
    """One checkpoint round of a job, as the swarm holds it (see the module docstring)."""

    job_id: str
    plan_version: int
    round: int
    step: int
    shards: tuple[ShardHolders, ...]

    def covers(self, num_blocks: int) -> bool:
        held = {b for sh in self.shards for b in range(sh.start, sh.end)}
        return held >= set(range(num_blocks))

    def holders_of(self, start: int, end: int) -> list[str]:
        """Peers holding a shard overlapping blocks ``[start, end)``."""
        return sorted({p for sh in self.shards if sh.start < end and start < sh.end for p in sh.holders})

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "plan_version": self.plan_version,
            "round": self.round,
            "step": self.step,
            "shards": [{"blocks": [sh.start, sh.end], "holders": {p: d for p, d in sh.sha256}} for sh in self.shards],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        """Parse :meth:`to_dict`; anything malformed is a CheckpointError."""
        try:
            shards = tuple(
                ShardHolders(int(s["blocks"][0]), int(s["blocks"][1]),
                             tuple(sorted((str(p), str(h)) for p, h in s["holders"].items())))
                for s in d["shards"]
            )
            return cls(str(d["job_id"]), int(d["plan_version"]), int(d["round"]), int(d["step"]), shards)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
            raise CheckpointError(f"malformed checkpoint manifest: {type(e).__name__}: {e}") from None


class ManifestBook:
    """Collects the shards peers report and says which steps' manifests are complete and new."""

    def __init__(self, job_id: str, num_blocks: int) -> None:
        self.job_id = job_id
        self.num_blocks = num_blocks
        self._by_step: dict[int, dict[tuple[int, int], dict[str, Shard]]] = {}
        self._plan_version: dict[int, int] = {}
        self._written: dict[int, Manifest] = {}

    def add(self, peer_id: str, plan_version: int, shards: Iterable[ShardReport]) -> None:
        """The shards ``peer_id`` reports holding (its progress record's ``shards``) under ``plan_version``."""
        for report in shards:
            sh = Shard.from_report(self.job_id, report)
            self._by_step.setdefault(sh.step, {}).setdefault((sh.start, sh.end), {})[peer_id] = sh
            self._plan_version[sh.step] = max(self._plan_version.get(sh.step, 0), plan_version)

    def manifest(self, step: int) -> Manifest:
        ranges = self._by_step.get(step, {})
        shards = tuple(
            ShardHolders(a, b, tuple(sorted((p, s.sha256) for p, s in held.items())))
            for (a, b), held in sorted(ranges.items())
        )
        rounds = [s.round for held in ranges.values() for s in held.values()]
        return Manifest(self.job_id, self._plan_version.get(step, 0), min(rounds, default=0), step, shards)

    def changed(self) -> list[Manifest]:
        """Complete manifests not written yet in this form (mark them with :meth:`written`)."""
        out = []
        for step in sorted(self._by_step):
            m = self.manifest(step)
            if m.covers(self.num_blocks) and self._written.get(step) != m:
                out.append(m)
        return out

    def written(self, m: Manifest) -> None:
        self._written[m.step] = m

    def newest(self) -> Manifest | None:
        """The newest step's manifest among those the reports cover whole, or None."""
        for step in sorted(self._by_step, reverse=True):
            m = self.manifest(step)
            if m.covers(self.num_blocks):
                return m
        return None


def countable_shards(shards: Iterable[ShardReport], *, placed: bool, current: bool, start_step: int) -> list[ShardReport]:
    """The shards of one peer's report that may enter a manifest while a plan starting at ``start_step`` runs.

    A peer outside the plan's pipelines (``placed`` False: a spare) trains nothing in it, and one still
    reporting an older plan (``current`` False) has not started it: a shard either reports past the
    plan's start is of the old plan's trajectory, trained on after the replan (a peer the replan moved
    out, until it heard of it) and never of this one, so a manifest must not list it as this job's
    checkpoint of that step. Their shards up to the start step are the checkpoints the plan started from.
    """
    if placed and current:
        return list(shards)
    return [sh for sh in shards if sh.step <= start_step]


def manifest_dir(report_dir: Path) -> Path:
    return Path(report_dir) / "manifests"


def write_manifest(report_dir: Path, m: Manifest) -> Path:
    """Write ``m`` atomically as ``<report dir>/manifests/step-NNNNNN.json``."""
    path = manifest_dir(report_dir) / f"step-{m.step:06d}.json"
    try:
        _atomic_write(path, json.dumps(m.to_dict(), indent=1).encode())
    except OSError as e:
        raise CheckpointError(f"cannot write checkpoint manifest {path}: {e}") from e
    return path


def latest_manifest(report_dir: Path, job_id: str, num_blocks: int) -> Manifest | None:
    """The newest readable manifest of ``job_id`` under ``report_dir`` that covers every block, or None."""
    d = manifest_dir(report_dir)
    if not d.is_dir():
        return None
    found = sorted(((int(hit.group(1)), p) for p in d.iterdir() if (hit := _NAME.match(p.name))), reverse=True)
    for _, path in found:
        try:
            man = Manifest.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, CheckpointError) as e:
            logger.warning("manifest %s unreadable (%s); trying an older one", path, e)
            continue
        if man.job_id == job_id and man.covers(num_blocks):
            return man
    return None
