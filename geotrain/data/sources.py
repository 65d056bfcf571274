"""Where token bytes come from: the embedded corpus, a local text file, or a local Hugging Face dataset.

What is the *embedded corpus*? The ``*.py`` source of the running
interpreter's standard library (``sysconfig`` ``stdlib`` path, site-packages
and dist-packages excluded), files in sorted relative-path order, concatenated
until a byte budget is reached. It exists on every machine without a download;
peers running the same Python version get byte-identical corpora, and the
sha256 ``digest`` lets a job check that.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from geotrain.errors import ConfigError

__all__ = ["Corpus", "stdlib_corpus", "text_file_corpus", "hf_corpus"]

logger = logging.getLogger(__name__)

_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True, eq=False)
class Corpus:
    """A named run of byte tokens: ``tokens`` is ``(N,)`` uint8; ``digest`` is sha256 of those bytes."""

    name: str
    tokens: torch.Tensor
    digest: str

    @classmethod
    def from_bytes(cls, name: str, data: bytes | bytearray) -> Corpus:
        if not data:
            raise ConfigError(f"data source {name!r} is empty; point it at some text")
        tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return cls(name=name, tokens=tokens, digest=hashlib.sha256(data).hexdigest())

    def __len__(self) -> int:
        return int(self.tokens.numel())


def _check_budget(max_bytes: int) -> None:
    if not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ConfigError(f"data.max_bytes must be a positive integer; got {max_bytes!r}")


@functools.lru_cache(maxsize=4)
def stdlib_corpus(max_bytes: int = 4 << 20) -> Corpus:
    """The embedded corpus (see the module docstring), at most ``max_bytes`` bytes; cached per budget."""
    _check_budget(max_bytes)
    root = Path(sysconfig.get_paths()["stdlib"])
    rel: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]  # prune: site-packages can be huge
        base = Path(dirpath).relative_to(root)
        rel.extend((base / f).as_posix() for f in filenames if f.endswith(".py"))
    files = [root / r for r in sorted(rel)]
    buf = bytearray()
    for path in files:
        if len(buf) >= max_bytes:
            break
        try:
            buf += path.read_bytes()
        except OSError as e:  # logged: a peer that skips a file others read gets a different digest
            logger.warning("embedded corpus: skipping %s (%s)", path, e)
            continue
        buf += b"\n"
    del buf[max_bytes:]
    logger.info("embedded corpus: %d bytes from %s", len(buf), root)
    return Corpus.from_bytes(f"stdlib:{root}", buf)


def text_file_corpus(path: str | Path, max_bytes: int | None = None) -> Corpus:
    """A local text file (or every ``*.txt`` file under a directory, sorted), read as raw bytes."""
    if max_bytes is not None:
        _check_budget(max_bytes)
    p = Path(path)
    if p.is_dir():
        files = sorted(p.rglob("*.txt"))
        if not files:
            raise ConfigError(f"data.path {str(p)!r} is a directory with no *.txt files")
    elif p.is_file():
        files = [p]
    else:
        raise ConfigError(f"data.path {str(p)!r} does not exist; give a text file or a directory of *.txt files")
    buf = bytearray()
    for f in files:
        buf += f.read_bytes()
        if max_bytes is not None and len(buf) >= max_bytes:
            del buf[max_bytes:]
            break
    return Corpus.from_bytes(f"text:{p}", buf)


def hf_corpus(
    path: str, *, split: str = "train", text_field: str = "text", max_bytes: int = 16 << 20, name: str | None = None
) -> Corpus:
    """Text from a Hugging Face ``datasets`` dataset available offline (a local dir/file or a cached name).

    Rows' ``text_field`` values are UTF-8 encoded and joined with newlines up to ``max_bytes``.
    Raises :class:`ConfigError` when ``datasets`` is missing or the data cannot be loaded.
    """
    _check_budget(max_bytes)
    try:
        import datasets  # optional dependency
    except ImportError:
        raise ConfigError("data.source = 'hf' needs the `datasets` package; pip install datasets") from None
    try:
        local = Path(path)
        if local.is_file():
            builder = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}.get(
                local.suffix
            )
            if builder is None:
                raise ConfigError(f"cannot tell the format of {path!r}; use .json/.jsonl/.csv/.parquet/.txt")
            ds = datasets.load_dataset(builder, data_files=str(local), split=split)
        elif local.is_dir() and (local / "dataset_info.json").exists():
            ds = datasets.load_from_disk(str(local))
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[split]
        else:
            ds = datasets.load_dataset(path, name, split=split)
    except ConfigError:
        raise
    except Exception as e:  # datasets raises many unrelated types; all mean "not usable here"
        raise ConfigError(f"could not load dataset {path!r} split {split!r} offline: {e}") from e
    if text_field not in ds.column_names:
        raise ConfigError(f"dataset {path!r} has no column {text_field!r}; columns are {ds.column_names}")
    buf = bytearray()
    for row in ds:
        buf += str(row[text_field]).encode("utf-8") + b"\n"
        if len(buf) >= max_bytes:
            break
    del buf[max_bytes:]
    return Corpus.from_bytes(f"hf:{path}:{split}", buf)
