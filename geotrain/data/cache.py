"""The token cache: a corpus tokenised once into a memory-mapped file every later run reuses.

What is a *token file*? The ids of every document of a source, in reading order, with the
tokenizer's EOS id between documents (nothing between them when it has none), as raw
little-endian integers: uint8 when the vocabulary fits in 256 ids, uint16 up to 65536, uint32
beyond. Next to it a metadata JSON records the dtype, the token count, the file's size and
sha256 (the *cache digest*: equal digests prove two peers train on the same tokens), the source
and tokenizer digests, and the read statistics.

A token file is keyed by (source digest, tokenizer digest) and built in one streaming pass into a
temporary file (fsync, then an atomic rename), so a crash never leaves a half-written file under
the final name. Its write buffer holds at most ``ram_budget_bytes``. On open, a file whose size
disagrees with its metadata (truncated, overwritten) or whose sha256 does not match is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from geotrain.data.disk import build_lock, fsync_dir, write_atomic
from geotrain.data.sources import DocumentSource, ReadStats
from geotrain.data.tokenizer import Tokenizer, default_cache_dir
from geotrain.errors import ConfigError, DataError

__all__ = ["DEFAULT_RAM_BUDGET", "TokenCache", "build_token_cache", "token_dtype"]

logger = logging.getLogger(__name__)

DEFAULT_RAM_BUDGET = 64 << 20
_FORMAT = "geotrain-tokens-v1"
_HASH_BLOCK = 1 << 20


def token_dtype(vocab_size: int) -> np.dtype[Any]:
    """The smallest unsigned dtype holding ids below ``vocab_size`` (uint8 / uint16 / uint32)."""
    if vocab_size <= 1 << 8:
        return np.dtype(np.uint8)
    if vocab_size <= 1 << 16:
        return np.dtype(np.uint16)
    if vocab_size <= 1 << 32:
        return np.dtype(np.uint32)
    raise ConfigError(f"vocabulary of {vocab_size} ids does not fit in 32-bit tokens")


@dataclass(frozen=True)
class TokenCache:
    """A built token file: ``path`` (tokens), ``meta_path`` (its metadata), and what the metadata says.

    ``digest`` is sha256 of the token file. ``max_write_bytes`` is the largest single write made
    while building it (bounded by the RAM budget); ``reused`` says the file was found, not built.
    """

    path: Path
    meta_path: Path
    dtype: str
    num_tokens: int
    digest: str
    source_digest: str
    tokenizer_digest: str
    documents: int
    skipped: int
    bytes_read: int
    files: int
    max_write_bytes: int
    reused: bool = False

    def tokens(self) -> np.memmap[Any, np.dtype[Any]]:
        """The tokens, ``(num_tokens,)`` read-only memory map."""
        return np.memmap(self.path, dtype=np.dtype(self.dtype), mode="r", shape=(self.num_tokens,))


def _key(source_digest: str, tokenizer_digest: str) -> str:
    return hashlib.sha256(f"{_FORMAT}:{source_digest}:{tokenizer_digest}".encode()).hexdigest()[:32]


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def _open_existing(tokens: Path, meta: Path, *, verify: bool) -> TokenCache | None:
    """The cache described by ``meta`` if ``tokens`` matches it; None (and a log line) when it must be rebuilt."""
    if not meta.is_file() or not tokens.is_file():
        return None
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
        if info.get("format") != _FORMAT:
            raise ValueError(f"format {info.get('format')!r}")
        fields = {
            k: info[k] for k in TokenCache.__dataclass_fields__ if k not in ("path", "meta_path", "reused")
        }
        cache = TokenCache(path=tokens, meta_path=meta, reused=True, **fields)
        expected = cache.num_tokens * np.dtype(cache.dtype).itemsize
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.warning("token cache metadata %s is unreadable (%s); rebuilding", meta, e)
        return None
    size = tokens.stat().st_size
    if size != expected:
        logger.warning(
            "token cache %s holds %d bytes, its metadata says %d; rebuilding", tokens, size, expected
        )
        return None
    if verify and _file_sha256(tokens) != cache.digest:
        logger.warning("token cache %s does not match its sha256; rebuilding", tokens)
        return None
    return cache


@contextmanager
def _progress(total: int, label: str) -> Iterator[Any]:
    """A callable ``advance(bytes_done)``: a rich progress bar on an interactive stderr, else log lines."""
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(
            TextColumn("tokenising {task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        ) as bar:
            task = bar.add_task(label, total=total or None)
            yield lambda done: bar.update(task, completed=done)
        return
    step = max(total // 10, 1)
    mark = [step]

    def advance(done: int) -> None:
        if done >= mark[0]:
            logger.info("tokenising %s: %d / %d bytes read", label, done, total)
            mark[0] = (done // step + 1) * step

    yield advance


def _encode_into(
    writer: _Writer, tokenizer: Tokenizer, batch: list[str], starts: list[bool], eos: int | None
) -> None:
    """Tokenise ``batch`` and append it, with EOS before each piece that starts a later document."""
    if not batch:
        return
    parts: list[Any] = []
    for ids, start in zip(tokenizer.encode_batch(batch), starts, strict=True):
        if start and eos is not None:
            parts.append([eos])
        parts.append(ids)
    try:  # one conversion per batch; numpy refuses ids that do not fit the dtype
        flat = np.concatenate([np.asarray(p, dtype=writer.dtype) for p in parts])
    except OverflowError:
        flat = None
    if flat is None or (flat.size and int(flat.max()) >= tokenizer.vocab_size):
        raise ConfigError(
            f"tokenizer {tokenizer.name!r} emits ids beyond its vocab_size {tokenizer.vocab_size}; "
            "its files are inconsistent"
        )
    writer.add(flat)
    batch.clear()
    starts.clear()


class _Writer:
    """Appends token ids to a file through a buffer of at most ``capacity`` tokens, hashing as it goes."""

    def __init__(self, f: Any, dtype: np.dtype[Any], capacity: int) -> None:
        self.f = f
        self.dtype = dtype
        self.buf = np.empty(capacity, dtype=dtype)
        self.fill = 0
        self.count = 0
        self.max_write = 0
        self.sha = hashlib.sha256()

    def add(self, ids: Any) -> None:
        arr = np.asarray(ids)
        assert arr.dtype == self.dtype, "callers convert ids to the token dtype"
        pos = 0
        while pos < arr.size:
            n = min(arr.size - pos, self.buf.size - self.fill)
            self.buf[self.fill : self.fill + n] = arr[pos : pos + n]
            self.fill += n
            pos += n
            if self.fill == self.buf.size:
                self.flush()

    def flush(self) -> None:
        if not self.fill:
            return
        data = self.buf[: self.fill].tobytes()
        self.f.write(data)
        self.sha.update(data)
        self.max_write = max(self.max_write, len(data))
        self.count += self.fill
        self.fill = 0


def build_token_cache(
    source: DocumentSource,
    tokenizer: Tokenizer,
    *,
    cache_dir: str | Path | None = None,
    ram_budget_bytes: int = DEFAULT_RAM_BUDGET,
    verify: bool = True,
) -> TokenCache:
    """The token file of ``source`` under ``tokenizer``: found in ``cache_dir`` (default
    ``~/.cache/geotrain/tokens``) or built there; see the module docstring.

    ``ram_budget_bytes`` bounds the write buffer and the text handed to the tokenizer at once;
    ``verify`` re-hashes a found file against its recorded sha256.
    """
    if not isinstance(ram_budget_bytes, int) or ram_budget_bytes < 1024:
        raise ConfigError(
            f"the token cache's RAM budget must be at least 1024 bytes; got {ram_budget_bytes!r}"
        )
    folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir() / "tokens"
    folder.mkdir(parents=True, exist_ok=True)
    key = _key(source.digest, tokenizer.digest)
    tokens_path, meta_path = folder / f"{key}.tokens", folder / f"{key}.json"
    found = _open_existing(tokens_path, meta_path, verify=verify)
    if found is None:
        with build_lock(tokens_path):
            found = _open_existing(tokens_path, meta_path, verify=verify)  # built while we waited?
            if found is None:
                return _build(source, tokenizer, folder, key, ram_budget_bytes)
    logger.info("token cache: reusing %s (%d tokens)", tokens_path, found.num_tokens)
    return found


def _build(
    source: DocumentSource, tokenizer: Tokenizer, folder: Path, key: str, ram_budget_bytes: int
) -> TokenCache:
    tokens_path, meta_path = folder / f"{key}.tokens", folder / f"{key}.json"
    dtype = token_dtype(tokenizer.vocab_size)
    eos = tokenizer.eos_id
    if eos is None and source.kind != "stdlib":
        logger.info(
            "tokenizer %s has no EOS: documents of %s are joined without a separator",
            tokenizer.name,
            source.label,
        )
    # half the budget for the write buffer, half for text waiting to be tokenised (and its ids)
    writer_capacity = max(1, (ram_budget_bytes // 2) // dtype.itemsize)
    text_budget = max(1, ram_budget_bytes // 8)  # a char's ids take ~4x its bytes while a batch is encoded
    stats = ReadStats()
    fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=f".{key}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f, _progress(source.total_bytes, source.label) as advance:
            writer = _Writer(f, dtype, writer_capacity)
            batch: list[str] = []
            starts: list[bool] = []  # does the piece begin a document after the first one?
            pending = 0
            at_start, first = True, True
            for text, last in source.pieces(stats):
                batch.append(text)
                starts.append(at_start and not first)
                first, at_start = False, last
                pending += len(text)
                if pending >= text_budget:
                    _encode_into(writer, tokenizer, batch, starts, eos)
                    advance(stats.bytes_read)
                    pending = 0
            _encode_into(writer, tokenizer, batch, starts, eos)
            advance(stats.bytes_read)
            writer.flush()
            f.flush()
            os.fsync(f.fileno())
        if writer.count == 0:
            raise DataError(f"data source {source.label!r} tokenised to no tokens")
        meta_path.unlink(missing_ok=True)  # a stale description must never pass for the new file's
        os.replace(tmp, tokens_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    digest = writer.sha.hexdigest()
    cache = TokenCache(
        path=tokens_path,
        meta_path=meta_path,
        dtype=dtype.name,
        num_tokens=writer.count,
        digest=digest,
        source_digest=source.digest,
        tokenizer_digest=tokenizer.digest,
        documents=stats.documents,
        skipped=stats.skipped,
        bytes_read=stats.bytes_read,
        files=stats.files,
        max_write_bytes=writer.max_write,
    )
    meta = {k: v for k, v in asdict(cache).items() if k not in ("path", "meta_path", "reused")}
    meta["format"] = _FORMAT
    meta["tokenizer"] = tokenizer.name
    meta["source"] = source.label
    write_atomic(meta_path, (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())
    fsync_dir(folder)
    logger.info(
        "token cache: %d documents -> %d %s tokens in %s (%d lines/rows skipped)",
        stats.documents,
        writer.count,
        dtype.name,
        tokens_path,
        stats.skipped,
    )
    return cache
