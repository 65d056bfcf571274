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
import glob
import hashlib
import json
import logging
import os
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from geotrain.errors import ConfigError, DataError

__all__ = [
    "Corpus",
    "DocumentSource",
    "ReadStats",
    "SourceFile",
    "find_files",
    "hf_corpus",
    "open_source",
    "resolve_path",
    "stdlib_corpus",
    "text_file_corpus",
]

logger = logging.getLogger(__name__)

_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True, eq=False)
class Corpus:
    """A named run of byte tokens: ``tokens`` is ``(N,)`` uint8; ``digest`` is sha256 of those bytes.

    ``documents`` and ``files`` count what was read into it (files or rows; files), for statistics.
    """

    name: str
    tokens: torch.Tensor
    digest: str
    documents: int = 0
    files: int = 0

    @classmethod
    def from_bytes(cls, name: str, data: bytes | bytearray, *, documents: int = 0, files: int = 0) -> Corpus:
        if not data:
            raise ConfigError(f"data source {name!r} is empty; point it at some text")
        tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return cls(
            name=name,
            tokens=tokens,
            digest=hashlib.sha256(data).hexdigest(),
            documents=documents,
            files=files,
        )

    def __len__(self) -> int:
        return int(self.tokens.numel())


def _check_budget(max_bytes: int) -> None:
    if not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ConfigError(f"data.max_bytes must be a positive integer; got {max_bytes!r}")


def _stdlib_files() -> tuple[Path, list[Path]]:
    """The embedded corpus's root and its ``*.py`` files in sorted relative-path order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    rel: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]  # prune: site-packages can be huge
        base = Path(dirpath).relative_to(root)
        rel.extend((base / f).as_posix() for f in filenames if f.endswith(".py"))
    return root, [root / r for r in sorted(rel)]


@functools.lru_cache(maxsize=4)
def stdlib_corpus(max_bytes: int = 4 << 20) -> Corpus:
    """The embedded corpus (see the module docstring), at most ``max_bytes`` bytes; cached per budget."""
    _check_budget(max_bytes)
    root, files = _stdlib_files()
    buf = bytearray()
    read = 0
    for path in files:
        if len(buf) >= max_bytes:
            break
        try:
            buf += path.read_bytes()
        except OSError as e:  # logged: a peer that skips a file others read gets a different digest
            logger.warning("embedded corpus: skipping %s (%s)", path, e)
            continue
        buf += b"\n"
        read += 1
    del buf[max_bytes:]
    logger.info("embedded corpus: %d bytes from %s", len(buf), root)
    return Corpus.from_bytes(f"stdlib:{root}", buf, documents=read, files=read)


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
        raise ConfigError(
            f"data.path {str(p)!r} does not exist; give a text file or a directory of *.txt files"
        )
    buf = bytearray()
    read = 0
    for f in files:
        buf += f.read_bytes()
        read += 1
        if max_bytes is not None and len(buf) >= max_bytes:
            del buf[max_bytes:]
            break
    return Corpus.from_bytes(f"text:{p}", buf, documents=read, files=read)


def hf_corpus(
    path: str,
    *,
    split: str = "train",
    text_field: str = "text",
    max_bytes: int = 16 << 20,
    name: str | None = None,
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
            builder = {
                ".json": "json",
                ".jsonl": "json",
                ".csv": "csv",
                ".parquet": "parquet",
                ".txt": "text",
            }.get(local.suffix)
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
    rows = 0
    for row in ds:
        buf += str(row[text_field]).encode("utf-8") + b"\n"
        rows += 1
        if len(buf) >= max_bytes:
            break
    del buf[max_bytes:]
    return Corpus.from_bytes(f"hf:{path}:{split}", buf, documents=rows)


# -- streaming document sources ------------------------------------------------------------------
#
# What is a *document*? One unit of text the token cache separates from the next by EOS: a text
# file, a JSON Lines record, a parquet or saved-dataset row, an embedded-corpus file. A source
# reads its documents in one streaming pass (a file at a time, a line or row batch at a time),
# never holding the corpus in memory; a text file longer than ``PIECE_BYTES`` comes as several
# line-aligned pieces of one document.

SourceKind = Literal["stdlib", "text", "jsonl", "parquet", "hf_disk"]
BadTextPolicy = Literal["skip", "error"]
SOURCE_KINDS: tuple[str, ...] = ("stdlib", "text", "jsonl", "parquet", "hf_disk")
PIECE_BYTES = 1 << 20  # largest piece of a text document handed to the tokenizer at once
_SUFFIXES = {"text": (".txt",), "jsonl": (".jsonl",), "parquet": (".parquet",)}
_HASH_BLOCK = 1 << 20
_BYTE_BUDGETED = ("stdlib", "text", "jsonl")  # kinds whose budget counts file bytes, read in file order
_BATCH_ROWS = 256


@dataclass
class ReadStats:
    """Counters filled while a source is read: ``skipped`` counts lines/rows dropped as bad text (or null)."""

    documents: int = 0
    skipped: int = 0
    bytes_read: int = 0
    files: int = 0


@dataclass(frozen=True)
class SourceFile:
    """One input file: its path here and its name relative to the source's root (the same on every peer)."""

    path: Path
    rel: str
    size: int


def resolve_path(path: str, data_dir: str | Path | None = None) -> str:
    """``path`` with ``~`` expanded; a relative path is taken relative to ``data_dir`` when one is given."""
    p = os.path.expanduser(path)
    if data_dir is not None and not os.path.isabs(p):
        p = os.path.join(os.path.expanduser(str(data_dir)), p)
    return p


def _files_under(directory: Path, suffixes: tuple[str, ...] | None) -> list[Path]:
    found = [
        Path(dirpath) / f
        for dirpath, dirnames, filenames in os.walk(directory)
        for f in filenames
        if (suffixes is None or f.endswith(suffixes)) and not f.startswith(".")
    ]
    return sorted(found, key=lambda f: f.relative_to(directory).as_posix())


def find_files(kind: str, path: str) -> list[SourceFile]:
    """The files ``path`` (a file, a directory or a glob) names for a ``kind`` source, sorted.

    A directory means every file with the kind's suffix under it (``hf_disk``: every file of the
    saved dataset, for the digest). Raises :class:`DataError` when nothing matches.
    """
    suffixes = _SUFFIXES.get(kind)
    if glob.has_magic(path):
        if kind == "hf_disk":
            raise DataError(
                f"data.path {path!r}: source 'hf_disk' takes one save_to_disk directory, not a glob"
            )
        base = Path(path)
        while glob.has_magic(str(base)):
            base = base.parent
        matches: list[Path] = []
        for m in sorted(glob.glob(path, recursive=True)):
            mp = Path(m)
            matches.extend(_files_under(mp, suffixes) if mp.is_dir() else [mp] if mp.is_file() else [])
        if not matches:
            raise DataError(f"data.path glob {path!r} matches no files")
        files = sorted(set(matches), key=lambda f: os.path.relpath(f, base))
    else:
        p = Path(path)
        if p.is_dir():
            base = p
            files = _files_under(p, None if kind == "hf_disk" else suffixes)
            if not files:
                want = (
                    "files"
                    if suffixes is None or kind == "hf_disk"
                    else "/".join(f"*{s}" for s in suffixes) + " files"
                )
                raise DataError(f"data.path {path!r} is a directory with no {want}")
        elif p.is_file():
            if kind == "hf_disk":
                raise DataError(
                    f"data.path {path!r}: source 'hf_disk' needs a save_to_disk directory, not a file"
                )
            base, files = p.parent, [p]
        else:
            raise DataError(f"data.path {path!r} does not exist; give a file, a directory or a glob")
    return [
        SourceFile(path=f, rel=Path(os.path.relpath(f, base)).as_posix(), size=f.stat().st_size)
        for f in files
    ]


def _utf8_cut(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 != 0x80:  # a lead (or ASCII) byte: does its character fit?
            need = (
                1
                if b < 0x80
                else 2
                if b >> 5 == 0b110
                else 3
                if b >> 4 == 0b1110
                else 4
                if b >> 3 == 0b11110
                else 1
            )
            return len(data) if back >= need else len(data) - back
    return len(data)


def _byte_lines(f: Any, limit: int) -> Iterator[tuple[bytes, bool]]:
    """``(chunk, ends_line)`` from a binary file: whole lines, a longer line in UTF-8-aligned chunks of ~``limit``."""
    carry = b""
    while True:
        chunk = f.readline(limit)
        if not chunk:
            if carry:
                yield carry, True
            return
        chunk, carry = carry + chunk, b""
        if chunk.endswith(b"\n"):
            yield chunk, True
            continue
        cut = _utf8_cut(chunk)
        chunk, carry = chunk[:cut], chunk[cut:]
        if chunk:
            yield chunk, False


class DocumentSource:
    """A set of input files (or the embedded corpus) read as documents; see the section comment above.

    ``digest``: sha256 of the read settings (kind, text field, split, bad-text policy, byte
    budget) and of every input file's relative name, size and content, computed streaming; peers
    holding the same data under different directories get the same digest. For the line-read
    kinds (stdlib, text, jsonl) the files that start past the byte budget are never read and are
    left out, so a huge directory read under a small budget is not hashed whole.
    ``max_bytes``: reading stops after the line or row that brings the raw bytes read to the
    budget (file bytes for the line-read kinds, text bytes for parquet and hf_disk).
    """

    def __init__(
        self,
        kind: str,
        files: list[SourceFile],
        *,
        label: str,
        text_field: str = "text",
        on_bad_text: BadTextPolicy = "skip",
        max_bytes: int | None = None,
        split: str = "train",
        root: Path | None = None,
    ) -> None:
        if kind not in SOURCE_KINDS:
            raise ConfigError(f"data.source must be one of {', '.join(SOURCE_KINDS)}; got {kind!r}")
        if on_bad_text not in ("skip", "error"):
            raise ConfigError(f"data.on_bad_text must be 'skip' or 'error'; got {on_bad_text!r}")
        if max_bytes is not None:
            _check_budget(max_bytes)
        self.kind = kind
        self.files = list(files)
        self.label = label
        self.text_field = text_field
        self.on_bad_text = on_bad_text
        self.max_bytes = max_bytes
        self.split = split
        self.root = root
        self._digest: str | None = None

    @property
    def total_bytes(self) -> int:
        """Bytes of input: the sum of file sizes, capped by the budget (the progress bar's total)."""
        total = sum(f.size for f in self.files)
        return total if self.max_bytes is None else min(total, self.max_bytes)

    @property
    def digest(self) -> str:
        if self._digest is None:
            h = hashlib.sha256()
            settings = {
                "kind": self.kind,
                "text_field": self.text_field,
                "split": self.split,
                "on_bad_text": self.on_bad_text,
                "max_bytes": self.max_bytes,
            }
            h.update(json.dumps(settings, sort_keys=True).encode() + b"\0")
            offset = 0
            for f in self.files:
                if self.kind in _BYTE_BUDGETED and self.max_bytes is not None and offset >= self.max_bytes:
                    break  # this file and the ones after it are never read: they cannot change the tokens
                offset += f.size
                fh = hashlib.sha256()
                with open(f.path, "rb") as fp:
                    while block := fp.read(_HASH_BLOCK):
                        fh.update(block)
                h.update(f"{f.rel}\0{f.size}\0{fh.hexdigest()}\0".encode())
            self._digest = h.hexdigest()
        return self._digest

    def documents(self) -> Iterator[str]:
        """The text of every document (a long text file as several pieces), in order."""
        for text, _ in self.pieces():
            yield text

    def pieces(self, stats: ReadStats | None = None) -> Iterator[tuple[str, bool]]:
        """``(text, ends_document)`` in reading order; fills ``stats``. Raises :class:`DataError` on bad data."""
        stats = stats if stats is not None else ReadStats()
        reader = {
            "stdlib": self._text_pieces,
            "text": self._text_pieces,
            "jsonl": self._jsonl_pieces,
            "parquet": self._parquet_pieces,
            "hf_disk": self._hf_disk_pieces,
        }[self.kind]
        for text, ends in reader(stats):
            if ends:
                stats.documents += 1
            yield text, ends
        if stats.documents == 0:
            skipped = f" ({stats.skipped} lines/rows skipped as bad text)" if stats.skipped else ""
            raise DataError(
                f"data source {self.label!r} is empty: it holds no text{skipped}; point it at some text"
            )

    # -- readers ------------------------------------------------------------------------------
    def _over_budget(self, stats: ReadStats) -> bool:
        return self.max_bytes is not None and stats.bytes_read >= self.max_bytes

    def _bad_text(self, stats: ReadStats, where: str, why: str) -> None:
        if self.on_bad_text == "error":
            raise DataError(f"{where}: {why} (data.on_bad_text = 'error'; use 'skip' to drop such text)")
        stats.skipped += 1
        if stats.skipped == 1:
            logger.warning("%s: %s; skipping it (further bad text is counted, not logged)", where, why)

    def _text_pieces(self, stats: ReadStats) -> Iterator[tuple[str, bool]]:
        for f in self.files:
            stats.files += 1
            parts: list[str] = []
            size = 0
            lineno = 1
            with open(f.path, "rb") as fp:
                for raw, ends_line in _byte_lines(fp, PIECE_BYTES):
                    stats.bytes_read += len(raw)
                    try:
                        text = raw.decode("utf-8")
                    except UnicodeDecodeError as e:
                        self._bad_text(
                            stats, f"{f.rel}:{lineno}", f"not valid UTF-8 ({e.reason} at byte {e.start})"
                        )
                    else:
                        parts.append(text)
                        size += len(raw)
                    lineno += ends_line
                    if self._over_budget(stats):
                        break
                    if size >= PIECE_BYTES:
                        yield "".join(parts), False
                        parts, size = [], 0
            if parts:
                yield "".join(parts), True
            if self._over_budget(stats):
                return

    def _jsonl_pieces(self, stats: ReadStats) -> Iterator[tuple[str, bool]]:
        field = self.text_field
        for f in self.files:
            stats.files += 1
            with open(f.path, "rb") as fp:
                for lineno, raw in enumerate(fp, 1):
                    stats.bytes_read += len(raw)
                    where = f"{f.rel}:{lineno}"
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as e:
                        self._bad_text(stats, where, f"not valid UTF-8 ({e.reason} at byte {e.start})")
                        continue
                    if line.strip():
                        try:
                            record = json.loads(line)
                        except json.JSONDecodeError as e:
                            raise DataError(f"{where}: not JSON ({e.msg} at column {e.colno})") from None
                        if not isinstance(record, dict) or field not in record:
                            raise DataError(f"{where}: the record has no field {field!r} (data.text_field)")
                        text = record[field]
                        if not isinstance(text, str):
                            raise DataError(
                                f"{where}: field {field!r} is {type(text).__name__}, not a string"
                            )
                        if _encodable(text):
                            if text:
                                yield text, True
                        else:
                            self._bad_text(
                                stats, where, "the text holds unpaired surrogates (not valid Unicode)"
                            )
                    if self._over_budget(stats):
                        return

    def _rows(
        self, stats: ReadStats, values: list[Any], label: str, start: int
    ) -> Iterator[tuple[str, bool]]:
        """Documents of one batch of rows (``bytes`` or None) numbered from ``start``."""
        for i, value in enumerate(values):
            if value is None:
                stats.skipped += 1
                continue
            stats.bytes_read += len(value)
            try:
                text = bytes(value).decode("utf-8")
            except UnicodeDecodeError as e:
                self._bad_text(
                    stats, f"{label}: row {start + i}", f"not valid UTF-8 ({e.reason} at byte {e.start})"
                )
                continue
            if text:
                yield text, True
            if self._over_budget(stats):
                return

    def _parquet_pieces(self, stats: ReadStats) -> Iterator[tuple[str, bool]]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        field = self.text_field
        for f in self.files:
            stats.files += 1
            try:
                pf = pq.ParquetFile(f.path)
            except (pa.ArrowException, OSError) as e:
                raise DataError(f"{f.rel}: not a readable parquet file ({e})") from e
            names = pf.schema_arrow.names
            if field not in names:
                raise DataError(f"{f.rel}: no column {field!r} (data.text_field); columns are {names}")
            kind = pf.schema_arrow.field(field).type
            if not (
                pa.types.is_string(kind)
                or pa.types.is_large_string(kind)
                or pa.types.is_binary(kind)
                or pa.types.is_large_binary(kind)
            ):
                raise DataError(f"{f.rel}: column {field!r} is {kind}, not text")
            row = 0
            try:
                for batch in pf.iter_batches(batch_size=_BATCH_ROWS, columns=[field]):
                    col = batch.column(0)
                    # as bytes: invalid UTF-8 in one row becomes that row's problem, not the batch's
                    values = col.cast(pa.large_binary()).to_pylist()
                    yield from self._rows(stats, values, f.rel, row)
                    row += len(values)
                    if self._over_budget(stats):
                        return
            except pa.ArrowException as e:
                raise DataError(f"{f.rel}: parquet data could not be read ({e})") from e

    def _hf_disk_pieces(self, stats: ReadStats) -> Iterator[tuple[str, bool]]:
        import pyarrow as pa

        assert self.root is not None, "an hf_disk source knows its directory"
        ds = load_saved_dataset(self.root, split=self.split, text_field=self.text_field)
        stats.files += 1
        kind = ds.features[self.text_field]
        row = 0
        for table in ds.select_columns([self.text_field]).with_format("arrow").iter(batch_size=_BATCH_ROWS):
            col = table.column(0)
            if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
                raise DataError(f"{self.label}: column {self.text_field!r} is {kind}, not text")
            values = col.cast(pa.large_binary()).to_pylist()
            yield from self._rows(stats, values, self.label, row)
            row += len(values)
            if self._over_budget(stats):
                return


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def load_saved_dataset(root: Path, *, split: str, text_field: str) -> Any:
    """``datasets.load_from_disk(root)`` (the ``split`` of a DatasetDict), checked to have ``text_field``."""
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            "data.source = 'hf_disk' needs the `datasets` package; pip install datasets"
        ) from None
    try:
        ds = datasets.load_from_disk(str(root))
    except Exception as e:  # datasets raises many unrelated types; all mean "not a saved dataset"
        raise DataError(f"{str(root)!r} is not a dataset saved with save_to_disk: {e}") from e
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{str(root)!r} has no split {split!r} (data.hf_split); splits are {list(ds)}")
        ds = ds[split]
    if text_field not in ds.column_names:
        raise DataError(
            f"{str(root)!r} has no column {text_field!r} (data.text_field); columns are {ds.column_names}"
        )
    return ds


def open_source(
    kind: str,
    path: str | None,
    *,
    text_field: str = "text",
    on_bad_text: BadTextPolicy = "skip",
    max_bytes: int | None = None,
    split: str = "train",
    data_dir: str | Path | None = None,
) -> DocumentSource:
    """The streaming source ``kind`` reading ``path`` (relative paths under ``data_dir``); see :class:`DocumentSource`."""
    if kind == "stdlib":
        root, paths = _stdlib_files()
        files = [SourceFile(path=p, rel=p.relative_to(root).as_posix(), size=p.stat().st_size) for p in paths]
        label = f"stdlib:{root}"
    else:
        if kind not in SOURCE_KINDS:
            raise ConfigError(f"data.source must be one of {', '.join(SOURCE_KINDS)}; got {kind!r}")
        if not path:
            raise ConfigError(f"data.source = {kind!r} needs data.path")
        resolved = resolve_path(path, data_dir)
        files = find_files(kind, resolved)
        label = f"{kind}:{resolved}"
        root = Path(resolved)
    return DocumentSource(
        kind,
        files,
        label=label,
        text_field=text_field,
        on_bad_text=on_bad_text,
        max_bytes=max_bytes,
        split=split,
        root=root,
    )
