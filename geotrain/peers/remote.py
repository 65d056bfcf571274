"""The optional off-swarm copy of a job's checkpoints: ``checkpoint.remote = "URL"``, through fsspec.

What is the *remote*? A directory-like store named by an fsspec URL (``file:///srv/ckpt``,
``s3://bucket/prefix``, ``gs://...``; only ``file://`` is tested here) that holds the same layout as a
peer's state directory (:mod:`geotrain.peers.checkpoint`)::

    URL/<job dir>/step-000120/b0-3.safetensors
    URL/<job dir>/step-000120/b0-3.json

Each stage group's leader (its first member in plan order, the member that also writes a shared
``checkpoint.dir``) uploads its group's shard after writing it locally, on its state store's writer
thread: training never waits on the upload. The shard's bytes go first and the sidecar last, so a
reader that finds a sidecar finds the whole shard, or a partial one the sidecar's SHA-256 refuses (an
object store's put is whole or absent anyway). A resume uses the remote only for blocks no live peer
holds; what it reads is verified like any other shard (:func:`geotrain.peers.statestore.verify_shard`).

Credentials are fsspec's business (its usual environment and config files); geotrain passes none.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from geotrain.errors import CheckpointError
from geotrain.peers.checkpoint import written_ns

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"step-(\d{6,})$")


class RemoteStore:
    """Shards under one fsspec URL (see the module docstring). Methods raise CheckpointError on I/O errors.

    ``url`` is a job's ``checkpoint.remote``, checked when the job was read (:class:`~geotrain.config.CheckpointSection`).
    """

    def __init__(self, url: str) -> None:
        import fsspec

        self.url = url
        try:
            fs, root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as e:  # e.g. s3:// without s3fs installed
            raise CheckpointError(f"checkpoint.remote {url!r} cannot be opened here: {e}") from e
        self._fs: Any = fs
        self._root = str(root).rstrip("/")

    def _step(self, job_dir: str, step: int) -> str:
        return f"{self._root}/{job_dir}/step-{step:06d}"

    def put(self, job_dir: str, step: int, name: str, data: bytes, sidecar: bytes) -> None:
        """Upload one shard: its bytes, then its sidecar."""
        d = self._step(job_dir, step)
        try:
            self._fs.makedirs(d, exist_ok=True)
            self._fs.pipe_file(f"{d}/{name}.safetensors", data)
            self._fs.pipe_file(f"{d}/{name}.json", sidecar)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot upload shard {name} of step {step} to {self.url}: {e}") from e

    def _written(self, step_path: Any) -> int:
        """The newest ``written_ns`` among a remote step's sidecars (-1 when none records it)."""
        stamps = []
        for path in self._fs.glob(f"{step_path}/b*-*.json"):
            try:
                written = written_ns(self._fs.cat_file(path))
            except OSError:
                continue
            if written is not None:
                stamps.append(written)
        return max(stamps, default=-1)

    def shards(self, job_dir: str, step: int) -> list[tuple[str, bytes, bytes]]:
        """(name, sidecar bytes, shard bytes) of every shard of ``step`` found (unverified; possibly none)."""
        d = self._step(job_dir, step)
        out = []
        try:
            if not self._fs.exists(d):
                return []
            for path in sorted(self._fs.glob(f"{d}/b*-*.json")):
                name = str(path).rsplit("/", 1)[-1][: -len(".json")]
                try:
                    out.append((name, self._fs.cat_file(path), self._fs.cat_file(f"{d}/{name}.safetensors")))
                except (OSError, ValueError) as e:  # a sidecar without its shard: refused by the caller
                    logger.warning("remote shard %s/%s unreadable: %s", d, name, e)
                    out.append((name, self._fs.cat_file(path), b""))
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot read step {step} from {self.url}: {e}") from e
        return out

    def prune(self, job_dir: str, keep: int) -> None:
        """Delete all but the ``keep`` steps of ``job_dir`` written last (by their sidecars' ``written_ns``, then
        by step number: the order of the job's lineage, as :meth:`StateStore.recent` keeps them locally)."""
        base = f"{self._root}/{job_dir}"
        try:
            if not self._fs.exists(base):
                return
            steps = sorted(
                ((self._written(p), int(m.group(1)), p) for p in self._fs.ls(base, detail=False)
                 if (m := _STEP_DIR.search(str(p)))),
                reverse=True,
            )
            for _, _, path in steps[keep:]:
                self._fs.rm(path, recursive=True)
        except (OSError, ValueError) as e:
            raise CheckpointError(f"cannot prune old steps under {base}: {e}") from e
