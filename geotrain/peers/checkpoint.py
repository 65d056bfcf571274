"""Checkpoint shards: one stage group's state in one safetensors file with a ``.json`` sidecar.

Layout::

    DIR/step-000120/b0-3.safetensors   tensors of blocks [0, 3): global params, outer momentum, local state
    DIR/step-000120/b0-3.json          sidecar: job id, blocks, round, step, names, slot, byte count, sha256
    DIR/step-000120/b3-6.safetensors ...

What is in a shard file? Tensors by name: ``p:<param>`` the group's global parameters, ``o:<param>`` its
outer momentum, and the writer's *local* state (:class:`~geotrain.sync.state.StageState`):
``e:<start>-<end>:<role>:<fragment>`` error-feedback residuals and ``a:<param>:<what>`` inner optimizer
(AdamW) state. safetensors holds tensors and strings only: loading a shard runs no code. Its header
metadata repeats job id, blocks, round and step, so a lone file still says what it is.

Used two ways: by every peer for its own state directory (:mod:`geotrain.peers.statestore`), and, with a
shared ``checkpoint.dir``, by one member per stage group (the first in plan order) writing its group's
blocks there after the round that ends at that step has committed. Every file is written to a temporary
name, fsynced and renamed, the sidecar last, so a crash mid-save leaves either a complete entry or none.
A step of a shared directory is *complete* when its verified entries cover every block of the model;
:func:`latest_complete` picks the newest complete step and ignores the rest (interrupted saves, a
truncated file, a sidecar whose hash does not match).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from geotrain.data.disk import write_atomic
from geotrain.errors import CheckpointError, CheckpointWriteError
from geotrain.sync.state import StageState, block_of

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d{6,})$")
EXT = ".safetensors"  # a shard's tensors; the sidecar is the same name with .json


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def _atomic_write(path: Path, data: bytes) -> None:
    """``geotrain.data.disk.write_atomic`` (temp file, fsync, rename, directory fsync) into a created directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)


def encode_shard(piece: StageState, start: int, end: int) -> tuple[bytes, dict[str, Any]]:
    """The safetensors bytes of blocks ``[start, end)`` of ``piece`` and their sidecar (sha256 included)."""
    tensors: dict[str, torch.Tensor] = {f"p:{n}": t for n, t in piece.params.items()}
    tensors.update({f"o:{n}": t for n, t in piece.momentum.items()})
    tensors.update(piece.local)
    tensors = {k: t.detach().cpu().contiguous() for k, t in tensors.items()}
    meta = {"job_id": piece.job_id, "blocks": f"{start}-{end}", "round": str(piece.round), "step": str(piece.step)}
    data = st_save(tensors, metadata=meta)
    sidecar = {
        "format": "safetensors",
        "job_id": piece.job_id,
        "blocks": [start, end],
        "round": piece.round,
        "step": piece.step,
        "names": sorted(piece.params),
        "slot": list(piece.slot) if piece.slot is not None and piece.local else None,
        "nbytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    return data, sidecar


def decode_shard(data: bytes, sidecar: dict[str, Any], job_id: str) -> StageState:
    """The state in verified shard bytes (CheckpointError when they are no shard of ours)."""
    try:
        tensors = st_load(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"not a safetensors shard: {e}") from None
    params = {k[2:]: t for k, t in tensors.items() if k.startswith("p:")}
    momentum = {k[2:]: t for k, t in tensors.items() if k.startswith("o:")}
    local = {k: t for k, t in tensors.items() if k[:2] in ("e:", "a:")}
    raw = sidecar.get("slot")
    slot = None
    if isinstance(raw, list) and len(raw) == 3:
        slot = (int(raw[0]), int(raw[1]), int(raw[2]))
    return StageState(job_id, int(sidecar["round"]), int(sidecar["step"]), params, momentum,
                      local if slot is not None else {}, slot if local else None)


def save_group(root: Path, state: StageState, *, start: int, end: int) -> tuple[Path, bytes, dict[str, Any]]:
    """Write blocks ``[start, end)`` of ``state`` as one entry of ``step-<state.step>`` under ``root``.

    Returns the sidecar's path, the shard's bytes and the sidecar (what an upload sends). A write the disk
    refuses raises :class:`~geotrain.errors.CheckpointWriteError` (a CheckpointError and an OSError)
    naming the file; nothing half-written is left under a final name.
    """
    piece = state.select(start, end)
    if not piece.params:
        raise CheckpointError(f"no parameters of blocks [{start}, {end}) to save")
    data, sidecar = encode_shard(piece, start, end)
    # when it was written: a replan restarts the step count below what the weights have seen, so the order
    # of writes, not the step number, is the order of the job's lineage (StateStore keeps the newest writes)
    sidecar["written_ns"] = time.time_ns()
    d = step_dir(root, piece.step)
    name = f"b{start}-{end}"
    _write(d / f"{name}{EXT}", data)
    _write(d / f"{name}.json", json.dumps(sidecar, indent=1).encode())
    return d / f"{name}.json", data, sidecar


def written_ns(sidecar: bytes | str) -> int | None:
    """The ``written_ns`` a shard's sidecar records (None: not JSON, or written before it was recorded)."""
    try:
        value = json.loads(sidecar).get("written_ns")
    except (ValueError, AttributeError):
        return None
    return value if type(value) is int else None


def _write(path: Path, data: bytes) -> None:
    try:
        _atomic_write(path, data)
    except OSError as e:
        raise CheckpointWriteError(f"cannot write checkpoint file {path}: {e}") from e


def _entries(d: Path) -> list[dict[str, Any]]:
    out = []
    for mf in sorted(d.glob("b*-*.json")):
        try:
            m = json.loads(mf.read_text())
            data = (d / (mf.stem + EXT)).read_bytes()
        except (OSError, ValueError):
            continue
        if len(data) != m.get("nbytes") or hashlib.sha256(data).hexdigest() != m.get("sha256"):
            logger.warning("checkpoint entry %s does not match its manifest; ignored", mf)
            continue
        m["_data"] = data
        out.append(m)
    return out


def _covers(entries: list[dict[str, Any]], num_blocks: int) -> bool:
    held: set[int] = set()
    for m in entries:
        a, b = m["blocks"]
        held.update(range(a, b))
    return held >= set(range(num_blocks))


def latest_complete(root: Path, num_blocks: int) -> int | None:
    """The newest step whose verified entries cover every block, or None."""
    if not root.is_dir():
        return None
    steps = sorted((int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.match(p.name))), reverse=True)
    for s in steps:
        if _covers(_entries(step_dir(root, s)), num_blocks):
            return s
    return None


def load(root: Path, step: int, *, job_id: str, start: int = 0, end: int | None = None) -> StageState:
    """Blocks ``[start, end)`` (all by default) of checkpoint ``step`` as a StageState for ``job_id``."""
    entries = _entries(step_dir(root, step))
    if not entries:
        raise CheckpointError(f"no complete entries in {step_dir(root, step)}")
    params: dict[str, torch.Tensor] = {}
    momentum: dict[str, torch.Tensor] = {}
    rounds = []
    for m in entries:
        a, b = m["blocks"]
        if end is not None and (b <= start or a >= end):
            continue
        got = decode_shard(m["_data"], m, job_id)
        params.update(got.params)
        momentum.update(got.momentum)
        rounds.append(int(m["round"]))
    keep = lambda d: {n: t for n, t in d.items() if start <= block_of(n) < (end if end is not None else 1 << 30)}  # noqa: E731
    return StageState(job_id, min(rounds, default=0), step, keep(params), keep(momentum))
