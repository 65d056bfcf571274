"""Checkpoints at round boundaries: each stage group's global state, written atomically, with manifests.

Layout::

    DIR/step-000120/b0-3.pt        global params + outer momentum of blocks [0, 3) (torch.save, tensors only)
    DIR/step-000120/b0-3.json      manifest: blocks, names, round, step, byte count, sha256 of the .pt file
    DIR/step-000120/b3-6.pt ...

One member per stage group (the first in plan order) writes its group's
blocks after the round that ends at that step has committed. Every file is
written to a temporary name, fsynced and renamed, and the manifest goes last,
so a crash mid-save leaves either a complete group entry or none. A step is
*complete* when its verified group entries cover every block of the model;
:func:`latest_complete` picks the newest complete step and ignores the rest
(interrupted saves, a truncated file, a manifest whose hash does not match).

Loading uses ``torch.load(..., weights_only=True)``: a checkpoint is data,
never code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Any

import torch

from geotrain.data.disk import write_atomic
from geotrain.errors import CheckpointError, CheckpointWriteError
from geotrain.peers.state import StageState, block_of

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step-(\d{6,})$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def _atomic_write(path: Path, data: bytes) -> None:
    """``geotrain.data.disk.write_atomic`` (temp file, fsync, rename, directory fsync) into a created directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)


def save_group(root: Path, state: StageState, *, start: int, end: int) -> Path:
    """Write blocks ``[start, end)`` of ``state`` as one group entry of ``step-<state.step>``.

    A write the disk refuses raises :class:`~geotrain.errors.CheckpointWriteError` (a CheckpointError and
    an OSError) naming the file; nothing half-written is left under a final name.
    """
    piece = state.select(start, end)
    if not piece.params:
        raise CheckpointError(f"no parameters of blocks [{start}, {end}) to save")
    import io

    buf = io.BytesIO()
    torch.save({"params": piece.params, "momentum": piece.momentum}, buf)
    data = buf.getvalue()
    d = step_dir(root, piece.step)
    name = f"b{start}-{end}"
    _write(d / f"{name}.pt", data)
    manifest = {
        "job_id": piece.job_id,
        "blocks": [start, end],
        "round": piece.round,
        "step": piece.step,
        "names": sorted(piece.params),
        "nbytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    _write(d / f"{name}.json", json.dumps(manifest, indent=1).encode())
    return d / f"{name}.json"


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
            data = (d / (mf.stem + ".pt")).read_bytes()
        except (OSError, ValueError):
            continue
        if len(data) != m.get("nbytes") or hashlib.sha256(data).hexdigest() != m.get("sha256"):
            logger.warning("checkpoint entry %s does not match its manifest; ignored", mf)
            continue
        m["_path"] = d / (mf.stem + ".pt")
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
        blob = torch.load(m["_path"], weights_only=True, map_location="cpu")
        params.update(blob["params"])
        momentum.update(blob.get("momentum", {}))
        rounds.append(int(m["round"]))
    keep = lambda d: {n: t for n, t in d.items() if start <= block_of(n) < (end if end is not None else 1 << 30)}  # noqa: E731
    return StageState(job_id, min(rounds, default=0), step, keep(params), keep(momentum))
