"""A peer's own copy of the job's global state: peer-held checkpoints, written in the background.

What is a *shard*? The global parameters and outer momentum of one block range
(one stage group of this peer) as of one checkpoint step, in one file. Every
peer writes the shards of the blocks it holds, so each block lives on every
member of its stage group; nothing is written to a shared disk.

Layout (the format of :mod:`geotrain.peers.checkpoint`, one tree per job)::

    STATE_DIR/<job id>/step-000120/b0-3.pt     params + momentum of blocks [0, 3) (torch.save, tensors only)
    STATE_DIR/<job id>/step-000120/b0-3.json   job id, blocks, round, step, names, byte count, sha256 of the .pt

Each file is written to a temporary name, fsynced and renamed, the ``.json``
last, so a shard is either whole or absent. :meth:`StateStore.submit` takes a
state already copied out of the training tensors (:meth:`StageWorker.state`
clones) and serialises and writes it on the store's own thread; the step
thread waits only when the previous checkpoint is still being written. The
newest ``keep`` steps of a job are kept, older ones deleted after each write.

Reading (:meth:`StateStore.load`) verifies every shard before any of it is
used: its ``.json`` must name the job and the step asked for, and the ``.pt``
must match the byte count and SHA-256 it records (and the digest the caller
expects, when given). A shard that fails is refused, logged and counted
(``refused``); the caller fetches those blocks elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from geotrain.errors import CheckpointError
from geotrain.peers import checkpoint
from geotrain.peers.state import StageState, block_of

logger = logging.getLogger(__name__)

_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_STEP_DIR = re.compile(r"^step-(\d{6,})$")


@dataclass(frozen=True)
class Shard:
    """One written shard: blocks ``[start, end)`` of ``job_id`` at checkpoint ``step`` (after ``round`` rounds)."""

    job_id: str
    round: int
    step: int
    start: int
    end: int
    sha256: str
    nbytes: int

    def to_wire(self) -> str:
        """``round:step:start-end:sha256``, the form a progress record carries."""
        return f"{self.round}:{self.step}:{self.start}-{self.end}:{self.sha256}"

    @classmethod
    def from_wire(cls, job_id: str, s: str) -> Shard:
        """Parse :meth:`to_wire`; a malformed string is a ValueError."""
        rnd, step, blocks, sha = s.split(":")
        a, b = blocks.split("-")
        if len(sha) != 64 or int(a) >= int(b):
            raise ValueError(f"malformed shard report {s!r}")
        return cls(job_id, int(rnd), int(step), int(a), int(b), sha, 0)


class StateStore:
    """One peer's state directory. Thread-safe: the step thread submits, the handler pool loads."""

    def __init__(self, root: Path, *, keep: int = 2) -> None:
        if keep < 1:
            raise CheckpointError(f"a state store keeps at least 1 checkpoint; got keep={keep}")
        self.root = Path(root)
        self.keep = keep
        self.refused = 0  # shards that failed verification on load
        self.failures = 0  # background writes the disk refused
        self.write_s = 0.0  # seconds the writer thread spent serialising and writing
        self.bytes_written = 0
        self._lock = threading.Lock()
        self._written: dict[tuple[str, int, int], Shard] = {}  # (job, start, end) -> newest shard
        self._queue: queue.Queue[tuple[StageState, list[tuple[int, int]]] | None] = queue.Queue(maxsize=1)
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None

    def job_dir(self, job_id: str) -> Path:
        if not _SAFE.match(job_id):
            job_id = "job-" + hashlib.sha256(job_id.encode()).hexdigest()[:16]
        return self.root / job_id

    # -- writing ----------------------------------------------------------------------------------
    def save(self, state: StageState, ranges: list[tuple[int, int]]) -> list[Shard]:
        """Write one shard per block range of ``state`` now (on the caller's thread); prune old steps."""
        t0 = time.perf_counter()
        out = []
        for start, end in ranges:
            mf = checkpoint.save_group(self.job_dir(state.job_id), state, start=start, end=end)
            m = json.loads(mf.read_text())
            shard = Shard(state.job_id, int(m["round"]), int(m["step"]), start, end, str(m["sha256"]),
                          int(m["nbytes"]))
            out.append(shard)
            with self._lock:
                self._written[(state.job_id, start, end)] = shard
                self.bytes_written += shard.nbytes
        self._prune(state.job_id)
        with self._lock:
            self.write_s += time.perf_counter() - t0
        return out

    def submit(self, state: StageState, ranges: list[tuple[int, int]]) -> None:
        """Write ``state`` (already a copy) on the writer thread; blocks only while the previous one is queued."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._write_loop, name="gt-statestore", daemon=True)
            self._thread.start()
        self._idle.clear()
        self._queue.put((state, ranges))

    def flush(self, timeout: float = 120.0) -> bool:
        """Wait until every submitted checkpoint is on disk (True) or ``timeout`` passes (False)."""
        return self._idle.wait(timeout)

    def close(self, timeout: float = 120.0) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                self._idle.set()
                return
            state, ranges = item
            try:
                self.save(state, ranges)
            except CheckpointError as e:
                self.failures += 1
                logger.error("peer checkpoint of step %d not written (%d so far): %s", state.step, self.failures, e)
            finally:
                if self._queue.empty():
                    self._idle.set()

    def _prune(self, job_id: str) -> None:
        steps = self.steps(job_id)
        for s in steps[self.keep:]:
            shutil.rmtree(checkpoint.step_dir(self.job_dir(job_id), s), ignore_errors=True)

    def written(self, job_id: str) -> list[Shard]:
        """The newest shard written for each block range of ``job_id`` (what progress reports)."""
        with self._lock:
            return [s for (j, _, _), s in sorted(self._written.items()) if j == job_id]

    # -- reading ----------------------------------------------------------------------------------
    def steps(self, job_id: str) -> list[int]:
        """Checkpoint steps of ``job_id`` on disk, newest first (complete or not)."""
        d = self.job_dir(job_id)
        if not d.is_dir():
            return []
        return sorted((int(m.group(1)) for p in d.iterdir() if (m := _STEP_DIR.match(p.name))), reverse=True)

    def load(
        self, job_id: str, step: int, start: int, end: int, *, expect: dict[tuple[int, int], str] | None = None
    ) -> StageState | None:
        """The verified shards of checkpoint ``step`` overlapping blocks ``[start, end)``, or None.

        ``expect`` maps a shard's block range to the SHA-256 a manifest records for it; a shard whose
        digest differs is refused too. Refused shards are counted in ``refused``.
        """
        d = checkpoint.step_dir(self.job_dir(job_id), step)
        if not d.is_dir():
            return None
        params: dict[str, torch.Tensor] = {}
        momentum: dict[str, torch.Tensor] = {}
        rounds: list[int] = []
        for mf in sorted(d.glob("b*-*.json")):
            m = self._verified(mf, job_id, step, expect)
            if m is None:
                continue
            a, b = m["blocks"]
            if b <= start or a >= end:
                continue
            try:
                blob = torch.load(m["_path"], weights_only=True, map_location="cpu")
            except (OSError, RuntimeError, ValueError) as e:
                self._refuse(mf, f"unreadable ({e})")
                continue
            params.update({n: t for n, t in blob["params"].items() if start <= block_of(n) < end})
            momentum.update({n: t for n, t in blob.get("momentum", {}).items() if start <= block_of(n) < end})
            rounds.append(int(m["round"]))
        if not params:
            return None
        return StageState(job_id, min(rounds), step, params, momentum)

    def _verified(
        self, mf: Path, job_id: str, step: int, expect: dict[tuple[int, int], str] | None
    ) -> dict[str, Any] | None:
        try:
            m = json.loads(mf.read_text())
            data = (mf.parent / (mf.stem + ".pt")).read_bytes()
            blocks = (int(m["blocks"][0]), int(m["blocks"][1]))
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            self._refuse(mf, f"unreadable ({e})")
            return None
        if m.get("job_id") != job_id or m.get("step") != step:
            self._refuse(mf, f"of job {m.get('job_id')!r} step {m.get('step')}, not job {job_id!r} step {step}")
            return None
        sha = hashlib.sha256(data).hexdigest()
        if len(data) != m.get("nbytes") or sha != m.get("sha256"):
            self._refuse(mf, "truncated or altered (size or SHA-256 differs from its .json)")
            return None
        if expect is not None and blocks in expect and expect[blocks] != sha:
            self._refuse(mf, "its SHA-256 differs from the coordinator's manifest")
            return None
        m["_path"] = mf.parent / (mf.stem + ".pt")
        m["blocks"] = list(blocks)
        return dict(m)

    def _refuse(self, mf: Path, why: str) -> None:
        with self._lock:
            self.refused += 1
        logger.warning("state shard %s refused: %s", mf, why)
