"""A peer's own copy of the job's global state: peer-held checkpoints, written in the background.

What is a *shard*? What this peer holds of one block range (one stage group of this peer) as of one
checkpoint step, in one safetensors file (:mod:`geotrain.peers.checkpoint`): the group's global
parameters and outer momentum, which every member of the group holds alike, and this peer's own local
state (error-feedback residuals, inner optimizer moments; see :class:`~geotrain.sync.state.StageState`).
Every peer writes the shards of the blocks it holds, so each block lives on every member of its stage
group; nothing is written to a shared disk.

Layout (one tree per job)::

    STATE_DIR/<job id>/step-000120/b0-3.safetensors   the tensors of blocks [0, 3)
    STATE_DIR/<job id>/step-000120/b0-3.json          job id, blocks, round, step, names, slot, bytes, sha256

Each file is written to a temporary name, fsynced and renamed, the ``.json`` last, so a shard is either
whole or absent. :meth:`StateStore.submit` takes a state already copied out of the training tensors
(:meth:`StageWorker.state` clones) and serialises and writes it on the store's own thread; the step
thread waits only when the previous checkpoint is still being written (``submit_wait_s`` counts that
wait). The ``keep`` most recently written steps of a job are kept (write order is the job's lineage:
:meth:`StateStore.recent`), older ones deleted after each write. With a remote
(``checkpoint.remote``, :mod:`geotrain.peers.remote`) the same thread then uploads the shards the
caller leads, and prunes the remote the same way; an upload that fails is logged and counted
(``upload_failures``), never raised.

Reading (:meth:`StateStore.load`, :meth:`StateStore.load_remote`) verifies every shard before any of it
is used (:func:`verify_shard`): its ``.json`` must name the job and the step asked for, and the shard's
bytes must match the byte count and SHA-256 it records (and the digest the caller expects, when given).
A shard that fails is refused, logged and counted (``refused``); the caller fetches those blocks elsewhere.

:meth:`StateStore.held` lists the verified shards on disk (scanned once per job, then kept current by
writes and pruning): what a peer reports in its progress records, before any plan too, so a coordinator
that lost every manifest can rebuild one from the holders' reports.
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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from geotrain.errors import CheckpointError
from geotrain.peers import checkpoint
from geotrain.peers.remote import RemoteStore
from geotrain.swarm.records import ShardReport
from geotrain.sync.state import StageState

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

    def report(self) -> ShardReport:
        """The typed form a progress record carries."""
        return ShardReport(round=self.round, step=self.step, start=self.start, end=self.end, sha256=self.sha256)

    @classmethod
    def from_report(cls, job_id: str, r: ShardReport) -> Shard:
        return cls(job_id, r.round, r.step, r.start, r.end, r.sha256, 0)


def job_dir_name(job_id: str) -> str:
    """The directory name of ``job_id`` (itself when safe as a file name, else a digest of it)."""
    return job_id if _SAFE.match(job_id) else "job-" + hashlib.sha256(job_id.encode()).hexdigest()[:16]


def verify_shard(
    sidecar: bytes, data: bytes, job_id: str, step: int, expect: dict[tuple[int, int], str] | None = None
) -> dict[str, Any] | str:
    """The parsed sidecar of a sound shard, or why it is refused (a string).

    Sound: the sidecar parses and names ``job_id`` and ``step``; ``data`` has the byte count and SHA-256
    it records; and, when ``expect`` (block range -> SHA-256, from a manifest) names its range, that digest.
    """
    try:
        m = json.loads(sidecar)
        blocks = (int(m["blocks"][0]), int(m["blocks"][1]))
    except (ValueError, KeyError, TypeError, IndexError) as e:
        return f"unreadable sidecar ({type(e).__name__}: {e})"
    if not isinstance(m, dict) or m.get("job_id") != job_id or m.get("step") != step:
        return f"of job {m.get('job_id')!r} step {m.get('step')}, not job {job_id!r} step {step}"
    sha = hashlib.sha256(data).hexdigest()
    if len(data) != m.get("nbytes") or sha != m.get("sha256"):
        return "truncated or altered (size or SHA-256 differs from its .json)"
    if expect is not None and blocks in expect and expect[blocks] != sha:
        return "its SHA-256 differs from the coordinator's manifest"
    m["blocks"] = list(blocks)
    return dict(m)


class StateStore:
    """One peer's state directory. Thread-safe: the step thread submits, the handler pool loads."""

    def __init__(self, root: Path, *, keep: int = 2, remote: RemoteStore | None = None) -> None:
        if keep < 1:
            raise CheckpointError(f"a state store keeps at least 1 checkpoint; got keep={keep}")
        self.root = Path(root)
        self.keep = keep
        self.remote = remote
        self.refused = 0  # shards that failed verification on load (local or remote)
        self.failures = 0  # background writes the disk refused
        self.upload_failures = 0  # uploads to the remote that failed
        self.write_s = 0.0  # seconds the writer thread spent serialising and writing
        self.upload_s = 0.0  # seconds the writer thread spent uploading
        self.submit_wait_s = 0.0  # seconds the step thread waited in submit (the previous write still queued)
        self.bytes_written = 0
        self.bytes_uploaded = 0
        self._lock = threading.Lock()
        self._scan_lock = threading.Lock()
        self._scanned: set[str] = set()  # jobs whose directory held() has read
        self._held: dict[str, dict[tuple[int, int, int], Shard]] = {}  # job -> (step, start, end) -> shard
        self._queue: queue.Queue[tuple[StageState, list[tuple[int, int]], list[tuple[int, int]]] | None] = (
            queue.Queue(maxsize=1)
        )
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None

    def configure(self, *, keep: int, remote: str | None) -> None:
        """The job's ``checkpoint.keep`` and ``checkpoint.remote`` (called when a peer adopts a job's plan)."""
        if keep < 1:
            raise CheckpointError(f"a state store keeps at least 1 checkpoint; got keep={keep}")
        self.keep = keep
        if remote is None:
            self.remote = None
        elif self.remote is None or self.remote.url != remote:
            self.remote = RemoteStore(remote)

    def job_dir(self, job_id: str) -> Path:
        return self.root / job_dir_name(job_id)

    # -- writing ----------------------------------------------------------------------------------
    def save(
        self, state: StageState, ranges: list[tuple[int, int]], *, upload: Iterable[tuple[int, int]] = ()
    ) -> list[Shard]:
        """Write one shard per block range of ``state`` now (on the caller's thread); prune old steps; then
        upload the ``upload`` ranges' shards to the remote, if any (failures logged and counted)."""
        t0 = time.perf_counter()
        out = []
        sent: list[tuple[str, bytes, bytes]] = []
        up = set(upload)
        for start, end in ranges:
            _, data, m = checkpoint.save_group(self.job_dir(state.job_id), state, start=start, end=end)
            shard = Shard(state.job_id, int(m["round"]), int(m["step"]), start, end, str(m["sha256"]),
                          int(m["nbytes"]))
            out.append(shard)
            if (start, end) in up:
                sent.append((f"b{start}-{end}", data, json.dumps(m, indent=1).encode()))
            with self._lock:
                self._held.setdefault(state.job_id, {})[(shard.step, start, end)] = shard
                self.bytes_written += shard.nbytes
        self._prune(state.job_id)
        t1 = time.perf_counter()
        with self._lock:
            self.write_s += t1 - t0
        if self.remote is not None and sent:
            self._upload(state, sent)
        return out

    def _upload(self, state: StageState, sent: list[tuple[str, bytes, bytes]]) -> None:
        assert self.remote is not None
        t0 = time.perf_counter()
        name = job_dir_name(state.job_id)
        try:
            for shard_name, data, sidecar in sent:
                self.remote.put(name, state.step, shard_name, data, sidecar)
                with self._lock:
                    self.bytes_uploaded += len(data)
            self.remote.prune(name, self.keep)
        except CheckpointError as e:
            with self._lock:
                self.upload_failures += 1
            logger.error("upload of step %d's shards not done (%d failures so far): %s", state.step,
                         self.upload_failures, e)
        finally:
            with self._lock:
                self.upload_s += time.perf_counter() - t0

    def submit(
        self, state: StageState, ranges: list[tuple[int, int]], *, upload: Iterable[tuple[int, int]] = ()
    ) -> None:
        """Write ``state`` (already a copy) on the writer thread; blocks only while the previous one is queued.

        ``upload``: the ranges whose shards go to the remote too (the groups this peer leads)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._write_loop, name="gt-statestore", daemon=True)
            self._thread.start()
        t0 = time.perf_counter()
        self._idle.clear()
        self._queue.put((state, ranges, list(upload)))
        with self._lock:
            self.submit_wait_s += time.perf_counter() - t0

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
            state, ranges, upload = item
            try:
                self.save(state, ranges, upload=upload)
            except CheckpointError as e:
                self.failures += 1
                logger.error("peer checkpoint of step %d not written (%d so far): %s", state.step, self.failures, e)
            finally:
                if self._queue.empty():
                    self._idle.set()

    def recent(self, job_id: str) -> list[int]:
        """Checkpoint steps of ``job_id`` on disk, the most recently written first (then the higher step).

        Write order, not step number, is the job's lineage: a replan starts the next plan at a round boundary
        no live peer has passed, while the peers carry on from their groups' newest committed state, so the
        old plan's checkpoints past that step are older than the new plan's first ones. Pruning by number
        deleted each new checkpoint right after it was written until the new plan passed the old steps.
        A step's time is the newest ``written_ns`` of its sidecars (older shards without it: the directory's
        modification time).
        """
        d = self.job_dir(job_id)
        if not d.is_dir():
            return []
        found = []
        for p in d.iterdir():
            hit = _STEP_DIR.match(p.name)
            if hit is None:
                continue
            stamps = []
            for mf in p.glob("b*-*.json"):
                try:
                    written = checkpoint.written_ns(mf.read_bytes())
                except OSError:
                    continue  # pruned meanwhile
                if written is not None:  # else not a sidecar we wrote (loading refuses it), or an older one
                    stamps.append(written)
            try:
                when = max(stamps) if stamps else p.stat().st_mtime_ns
            except OSError:
                continue  # pruned meanwhile
            found.append((when, int(hit.group(1))))
        return [step for _, step in sorted(found, reverse=True)]

    def _prune(self, job_id: str) -> None:
        steps = self.recent(job_id)
        for s in steps[self.keep:]:
            shutil.rmtree(checkpoint.step_dir(self.job_dir(job_id), s), ignore_errors=True)
        kept = set(steps[: self.keep])
        with self._lock:
            held = self._held.get(job_id, {})
            for key in [k for k in held if k[0] not in kept]:
                del held[key]

    def written(self, job_id: str) -> list[Shard]:
        """The newest shard held for each block range of ``job_id``."""
        newest: dict[tuple[int, int], Shard] = {}
        for sh in self.held(job_id):
            if (sh.start, sh.end) not in newest:
                newest[(sh.start, sh.end)] = sh
        return sorted(newest.values(), key=lambda s: (s.start, s.end))

    def held(self, job_id: str) -> list[Shard]:
        """Every verified shard of ``job_id`` this store holds, newest step first (what progress reports).

        The first call for a job reads and verifies what is on disk (a directory a peer was restarted on);
        later calls see what :meth:`save` wrote and pruning left.
        """
        with self._scan_lock:  # one scan per job, whichever thread asks first
            self._scan(job_id)
        with self._lock:
            return [self._held[job_id][k] for k in sorted(self._held[job_id], key=lambda k: (-k[0], k[1], k[2]))]

    def _scan(self, job_id: str) -> None:
        """Index the verified shards of ``job_id`` on disk, once (the caller holds ``_scan_lock``)."""
        if job_id in self._scanned:
            return
        found: dict[tuple[int, int, int], Shard] = {}
        for step in self.recent(job_id)[: self.keep]:
            d = checkpoint.step_dir(self.job_dir(job_id), step)
            for mf in sorted(d.glob("b*-*.json")):
                m = self._verified(mf, job_id, step, None)
                if m is not None:
                    a, b = m["blocks"]
                    found[(step, a, b)] = Shard(job_id, int(m["round"]), step, a, b, str(m["sha256"]),
                                                int(m["nbytes"]))
        kept = set(self.recent(job_id)[: self.keep])  # pruning may have run meanwhile
        with self._lock:
            held = self._held.setdefault(job_id, {})
            for key, sh in found.items():
                if key[0] in kept:
                    held.setdefault(key, sh)  # a shard written meanwhile wins
        self._scanned.add(job_id)

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
        pieces = []
        for mf in sorted(d.glob("b*-*.json")):
            m = self._verified(mf, job_id, step, expect)
            if m is not None:
                pieces.append((mf, m))
        return self._assemble(job_id, start, end, pieces)

    def load_remote(self, job_id: str, step: int, start: int, end: int) -> StageState | None:
        """Like :meth:`load`, from the remote (None without one, or when it holds nothing sound there); the
        group's state only (the uploading leader's local state is its own)."""
        if self.remote is None:
            return None
        try:
            found = self.remote.shards(job_dir_name(job_id), step)
        except CheckpointError as e:
            logger.warning("remote checkpoint unreadable: %s", e)
            return None
        pieces = []
        for name, sidecar, data in found:
            m = verify_shard(sidecar, data, job_id, step)
            if isinstance(m, str):
                self._refuse(f"{self.remote.url}/{name}", m)
                continue
            m["_data"] = data
            pieces.append((f"{self.remote.url}/{name}", m))
        got = self._assemble(job_id, start, end, pieces)
        return got.without_local() if got is not None else None  # the uploader's local state is not ours

    def _assemble(self, job_id: str, start: int, end: int, pieces: list[tuple[Any, dict[str, Any]]]) -> StageState | None:
        state: StageState | None = None
        for where, m in pieces:
            a, b = m["blocks"]
            if b <= start or a >= end:
                continue
            try:
                got = checkpoint.decode_shard(m["_data"], m, job_id).select(start, end)
            except CheckpointError as e:
                self._refuse(where, str(e))
                continue
            state = got if state is None else state.merge(got)
        return state if state is not None and state.params else None

    def _verified(
        self, mf: Path, job_id: str, step: int, expect: dict[tuple[int, int], str] | None
    ) -> dict[str, Any] | None:
        try:
            sidecar = mf.read_bytes()
            data = (mf.parent / (mf.stem + checkpoint.EXT)).read_bytes()
        except OSError as e:
            self._refuse(mf, f"unreadable ({e})")
            return None
        m = verify_shard(sidecar, data, job_id, step, expect)
        if isinstance(m, str):
            self._refuse(mf, m)
            return None
        m["_data"] = data
        return m

    def _refuse(self, where: Any, why: str) -> None:
        with self._lock:
            self.refused += 1
        logger.warning("state shard %s refused: %s", where, why)
