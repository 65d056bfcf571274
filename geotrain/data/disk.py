"""Writing cache files safely: atomic replacement and a lock so processes sharing a cache build once.

What is the *build lock*? An exclusive ``flock`` on ``<file>.lock`` next to a cache entry, held
while one process builds that entry. Peers on one machine that share a cache directory (the
demo's children, say) wait for the first builder and then reuse its result instead of all
training and tokenising at once. The kernel releases the lock when its holder exits, crash
included, so a dead builder never blocks the others; a live one is waited for at most
``timeout_s``.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from geotrain.errors import DataError

__all__ = ["build_lock", "fsync_dir", "write_atomic"]

logger = logging.getLogger(__name__)

_POLL_S = 0.05


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (where the platform lets a directory be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory; the rename itself is still atomic
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` or its previous content, never a part: temp file, fsync, rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


@contextmanager
def build_lock(path: Path, *, timeout_s: float = 3600.0) -> Iterator[None]:
    """Hold the build lock of cache entry ``path`` (see the module docstring); DataError after ``timeout_s``."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): concurrent builders each build; the atomic rename keeps it safe
        yield
        return
    lock = path.with_name(path.name + ".lock")
    with open(lock, "a+b") as f:
        deadline = time.monotonic() + timeout_s
        waited = False
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    logger.info("waiting for another process building %s", path)
                    waited = True
                if time.monotonic() >= deadline:
                    raise DataError(
                        f"{path}: another process held its build lock for over {timeout_s:.0f} s"
                    ) from None
                time.sleep(_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
