"""Train/validation split, per-pipeline shards and deterministic batches over a run of tokens.

What is a *shard*? The slice of the training tokens one pipeline trains on:
the train split cut into ``num_shards`` contiguous, equal slices, one per
pipeline index, so pipelines of a job see disjoint data.

The split is by chunks: the tokens are cut into ``chunk_bytes``-token chunks (for the byte
tokenizer a token is a byte) and every ``round(1 / val_fraction)``-th chunk goes to validation,
so validation samples the whole corpus rather than only its last files. The split is a view:
train and validation indices map onto the one token run (in memory for the byte default,
memory-mapped from the token cache otherwise), nothing is copied.

A batch is ``(B, T + 1)`` int64 tokens: inputs are ``[:, :-1]``, targets
``[:, 1:]``. The batch of inner step ``s`` is a pure function of ``(seed,
shard, s)``, so a resumed run and a peer that rebuilds the iterator (say, the
last stage wanting targets) draw the same windows.

Where do the tokens come from? The byte default (``tokenizer = "bytes"`` with source
``"stdlib"``, ``"text"`` without a glob, or ``"hf"``) reads the corpus's bytes into memory as
it always has. Anything else streams the source's documents through the tokenizer into the
token cache (:mod:`geotrain.data.cache`) and memory-maps the result.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from geotrain.data.cache import DEFAULT_RAM_BUDGET, TokenCache, build_token_cache
from geotrain.data.sources import (
    SOURCE_KINDS,
    Corpus,
    hf_corpus,
    open_source,
    resolve_path,
    stdlib_corpus,
    text_file_corpus,
)
from geotrain.data.tokenizer import ByteTokenizer, Tokenizer, default_cache_dir, load_tokenizer
from geotrain.errors import ConfigError, DataError

__all__ = ["DataConfig", "DatasetStats", "TokenDataset", "load_corpus", "build_dataset"]

logger = logging.getLogger(__name__)

_KINDS = ("hf", *SOURCE_KINDS)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the data comes from, how it is tokenised and how it is split.

    - ``source``: "stdlib" (embedded), "text", "jsonl", "parquet", "hf_disk" (a ``save_to_disk``
      directory), or "hf" (the older in-memory loader, byte tokens only).
    - ``path``: a file, a directory or a glob; a relative path is resolved against the peer's
      ``data_dir`` when one is given.
    - ``text_field``: the JSON field / column holding the text (jsonl, parquet, hf_disk).
    - ``tokenizer``: "bytes", "bpe:N", or a tokenizer.json file / tokenizer directory.
    - ``on_bad_text``: a line or row that is not valid UTF-8 is skipped and counted ("skip") or
      stops the build with the file and line ("error").
    - ``max_bytes``: the budget of raw input bytes read.
    - ``cache_dir``: the root of the caches (``tokens/``, ``tokenizers/``); default ``~/.cache/geotrain``.
    - ``ram_budget_bytes``: the most memory the token cache's builder buffers.
    - ``chunk_bytes``: the split's chunk length, in tokens (bytes for the byte tokenizer).
    """

    source: Literal["stdlib", "text", "jsonl", "parquet", "hf_disk", "hf"] = "stdlib"
    path: str | None = None
    tokenizer: str = "bytes"
    text_field: str = "text"
    on_bad_text: Literal["skip", "error"] = "skip"
    max_bytes: int = 4 << 20
    val_fraction: float = 0.05
    chunk_bytes: int = 64 << 10
    cache_dir: str | None = None
    ram_budget_bytes: int = DEFAULT_RAM_BUDGET
    hf_split: str = "train"
    hf_text_field: str = "text"
    hf_name: str | None = None

    def __post_init__(self) -> None:
        if self.source not in _KINDS:
            raise ConfigError(
                f"data.source must be one of {', '.join(repr(k) for k in _KINDS)}; got {self.source!r}"
            )
        if self.source != "stdlib" and not self.path:
            raise ConfigError(f"data.source = {self.source!r} needs data.path")
        if not isinstance(self.max_bytes, int) or self.max_bytes <= 0:
            raise ConfigError(f"data.max_bytes must be a positive integer; got {self.max_bytes!r}")
        if not 0.0 < self.val_fraction < 0.5:
            raise ConfigError(f"data.val_fraction must be in (0, 0.5); got {self.val_fraction!r}")
        if not isinstance(self.chunk_bytes, int) or self.chunk_bytes < 1:
            raise ConfigError(f"data.chunk_bytes must be a positive integer; got {self.chunk_bytes!r}")
        if not isinstance(self.tokenizer, str) or not self.tokenizer.strip():
            raise ConfigError(
                f"data.tokenizer must be 'bytes', 'bpe:N' or a tokenizer path; got {self.tokenizer!r}"
            )
        if self.tokenizer.startswith("bpe:") and not self.tokenizer[4:].isdigit():
            raise ConfigError(
                f"data.tokenizer {self.tokenizer!r}: write bpe:N with N an integer, e.g. bpe:8192"
            )
        if self.source == "hf" and self.tokenizer != "bytes":
            raise ConfigError(
                "data.source = 'hf' reads byte tokens only; for another tokenizer use 'jsonl', 'parquet' or 'hf_disk'"
            )
        if not isinstance(self.text_field, str) or not self.text_field:
            raise ConfigError(f"data.text_field must be a non-empty string; got {self.text_field!r}")
        if self.on_bad_text not in ("skip", "error"):
            raise ConfigError(f"data.on_bad_text must be 'skip' or 'error'; got {self.on_bad_text!r}")
        if not isinstance(self.ram_budget_bytes, int) or self.ram_budget_bytes < 1024:
            raise ConfigError(
                f"data.ram_budget_bytes must be an integer >= 1024; got {self.ram_budget_bytes!r}"
            )

    @property
    def is_byte_default(self) -> bool:
        """True when the corpus is read into memory as raw bytes, exactly as before tokenizers existed."""
        if self.tokenizer != "bytes":
            return False
        return self.source in ("stdlib", "hf") or (
            self.source == "text" and not glob.has_magic(self.path or "")
        )


@dataclass(frozen=True)
class DatasetStats:
    """What building the dataset read: ``documents``, ``tokens``, ``skipped`` (bad-text lines/rows), raw ``bytes_read``, ``files``."""

    documents: int
    tokens: int
    skipped: int = 0
    bytes_read: int = 0
    files: int = 0


def _generator(*key: int) -> torch.Generator:
    state = np.random.SeedSequence([k & 0xFFFFFFFFFFFFFFFF for k in key]).generate_state(2, np.uint32)
    g = torch.Generator(device="cpu")
    g.manual_seed(int(state[0]) << 32 | int(state[1]))
    return g


class _Split:
    """One side of the split as a view of the token run: logical index -> index into ``tokens``.

    ``every == 0``: the contiguous run ``[offset, offset + length)``. Otherwise chunk ``i`` of
    length ``chunk`` is validation when ``i % every == every - 1``; ``val`` says which side this is.
    Only the run's last chunk may be short, and it is last on its side too, so the mapping is
    plain arithmetic.
    """

    def __init__(
        self, n: int, *, offset: int = 0, length: int = 0, chunk: int = 1, every: int = 0, val: bool = False
    ):
        self.chunk, self.every, self.val, self.offset = chunk, every, val, offset
        if every == 0:
            self.length = length
            return
        full, rem = divmod(n, chunk)
        val_full = full // every
        tail_is_val = full % every == every - 1
        if val:
            self.length = val_full * chunk + (rem if tail_is_val else 0)
        else:
            self.length = (full - val_full) * chunk + (0 if tail_is_val else rem)

    def physical(self, idx: np.ndarray) -> np.ndarray:
        if self.every == 0:
            return idx + self.offset
        j, off = np.divmod(idx, self.chunk)
        if self.val:
            c = j * self.every + (self.every - 1)
        else:
            c = j + j // (self.every - 1)
        return c * self.chunk + off


class TokenDataset:
    """A run of tokens split into train/validation (see the module docstring), with batch helpers.

    - ``tokens``: the whole run, ``(N,)`` (uint8 for bytes; uint16/uint32 memory map otherwise).
    - ``tokenizer``: what made them; ``vocab_size`` its vocabulary.
    - ``digest``: sha256 of the token run (for the byte default, the corpus digest, the same thing).
    - ``stats``: :class:`DatasetStats`; ``cache``: the :class:`TokenCache` behind the run, if any.
    """

    def __init__(self, corpus: Corpus, *, val_fraction: float = 0.05, chunk_bytes: int = 64 << 10) -> None:
        self.corpus: Corpus | None = corpus
        self.cache: TokenCache | None = None
        self.tokenizer: Tokenizer = ByteTokenizer()
        self.digest = corpus.digest
        self.stats = DatasetStats(
            documents=corpus.documents, tokens=len(corpus), bytes_read=len(corpus), files=corpus.files
        )
        self._setup(corpus.tokens.numpy(), val_fraction=val_fraction, chunk=chunk_bytes)

    @classmethod
    def from_cache(
        cls,
        cache: TokenCache,
        *,
        tokenizer: Tokenizer,
        val_fraction: float = 0.05,
        chunk_tokens: int = 64 << 10,
    ) -> TokenDataset:
        """A dataset over a token cache's memory-mapped tokens."""
        self = cls.__new__(cls)
        self.corpus = None
        self.cache = cache
        self.tokenizer = tokenizer
        self.digest = cache.digest
        self.stats = DatasetStats(
            documents=cache.documents,
            tokens=cache.num_tokens,
            skipped=cache.skipped,
            bytes_read=cache.bytes_read,
            files=cache.files,
        )
        self._setup(cache.tokens(), val_fraction=val_fraction, chunk=chunk_tokens)
        return self

    def _setup(self, tokens: np.ndarray, *, val_fraction: float, chunk: int) -> None:
        self.tokens = tokens
        n = int(tokens.shape[0])
        if n < 2:
            raise DataError(
                f"the corpus has {n} token(s), fewer tokens than one batch needs; give it more text"
            )
        every = max(2, round(1.0 / val_fraction))
        if -(-n // chunk) < every:
            # too small for chunked split: keep the tail as validation
            cut = max(1, int(n * (1 - val_fraction)))
            self._train, self._val = _Split(n, length=cut), _Split(n, offset=cut, length=n - cut)
        else:
            self._train = _Split(n, chunk=chunk, every=every)
            self._val = _Split(n, chunk=chunk, every=every, val=True)

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.vocab_size)

    def _gather(self, split: _Split, idx: np.ndarray) -> np.ndarray:
        return np.asarray(self.tokens[split.physical(idx)])

    def _materialise(self, split: _Split, start: int, stop: int) -> torch.Tensor:
        values = self._gather(split, np.arange(start, stop, dtype=np.int64))
        return torch.from_numpy(values if values.dtype == np.uint8 else values.astype(np.int64))

    @property
    def train(self) -> torch.Tensor:
        """The train tokens, ``(N_train,)``, as a new tensor (uint8 for bytes, int64 otherwise)."""
        return self._materialise(self._train, 0, self._train.length)

    @property
    def val(self) -> torch.Tensor:
        """The validation tokens, ``(N_val,)``, as a new tensor (uint8 for bytes, int64 otherwise)."""
        return self._materialise(self._val, 0, self._val.length)

    def _shard_range(self, index: int, num_shards: int) -> tuple[int, int]:
        if not 0 <= index < num_shards:
            raise ConfigError(f"shard index {index} out of range for {num_shards} shards")
        n = self._train.length // num_shards
        return index * n, n

    def shard(self, index: int, num_shards: int) -> torch.Tensor:
        """Pipeline ``index``'s contiguous slice of the train tokens, ``(N / num_shards,)``, as a new tensor."""
        start, n = self._shard_range(index, num_shards)
        return self._materialise(self._train, start, start + n)

    def get_batch(
        self, step: int, *, batch_size: int, seq_len: int, seed: int, shard: int = 0, num_shards: int = 1
    ) -> torch.Tensor:
        """Batch of inner step ``step``: ``(batch_size, seq_len + 1)`` int64 windows of the shard."""
        start, n = self._shard_range(shard, num_shards)
        span = n - seq_len - 1
        if span < 1:
            raise DataError(
                f"shard {shard}/{num_shards} has {n} tokens, fewer tokens than one batch needs "
                f"(seq_len + 2 = {seq_len + 2}); use fewer pipelines, a shorter seq_len or more data (data.max_bytes)"
            )
        starts = torch.randint(
            0, span + 1, (batch_size,), generator=_generator(seed, shard, num_shards, step)
        )
        idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]  # (B, T + 1)
        return torch.from_numpy(self._gather(self._train, idx.numpy() + start).astype(np.int64))

    def batches(
        self,
        *,
        batch_size: int,
        seq_len: int,
        seed: int,
        shard: int = 0,
        num_shards: int = 1,
        start_step: int = 0,
    ) -> Iterator[torch.Tensor]:
        """Endless ``get_batch(start_step), get_batch(start_step + 1), ...``."""
        step = start_step
        while True:
            yield self.get_batch(
                step, batch_size=batch_size, seq_len=seq_len, seed=seed, shard=shard, num_shards=num_shards
            )
            step += 1

    def val_batches(self, *, batch_size: int, seq_len: int, num_batches: int) -> list[torch.Tensor]:
        """A fixed validation set: ``num_batches`` batches of evenly spaced windows, no randomness."""
        n = batch_size * num_batches
        span = self._val.length - seq_len - 1
        if span < 0:
            raise DataError(f"validation split has {self._val.length} tokens; need more than seq_len + 1")
        starts = torch.linspace(0, span, n).long()
        idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]  # (n, T + 1)
        return list(torch.from_numpy(self._gather(self._val, idx.numpy()).astype(np.int64)).split(batch_size))


def load_corpus(config: DataConfig, *, data_dir: str | Path | None = None) -> Corpus:
    """The byte default's in-memory corpus (``source`` "stdlib", "text" or "hf")."""
    if config.source == "stdlib":
        return stdlib_corpus(config.max_bytes)
    assert config.path is not None
    if config.source == "text":
        return text_file_corpus(resolve_path(config.path, data_dir), config.max_bytes)
    if config.source != "hf":
        raise ConfigError(
            f"load_corpus reads 'stdlib', 'text' or 'hf' sources; use build_dataset for {config.source!r}"
        )
    path = config.path
    if data_dir is not None and os.path.exists(resolve_path(path, data_dir)):
        path = resolve_path(path, data_dir)
    return hf_corpus(
        path,
        split=config.hf_split,
        text_field=config.hf_text_field,
        max_bytes=config.max_bytes,
        name=config.hf_name,
    )


def _tokenizer_spec(spec: str, data_dir: str | Path | None) -> str:
    if spec == "bytes" or spec.startswith("bpe:"):
        return spec
    return resolve_path(spec, data_dir)


def build_dataset(config: DataConfig | None = None, *, data_dir: str | Path | None = None) -> TokenDataset:
    """The configured dataset (the embedded corpus, byte tokens, by default); see the module docstring.

    ``data_dir``: this peer's copy of the job's data; relative ``path`` and tokenizer paths are
    resolved against it, so the job names data the same way on every peer.
    """
    config = config or DataConfig()
    if config.is_byte_default:
        corpus = load_corpus(config, data_dir=data_dir)
        return TokenDataset(corpus, val_fraction=config.val_fraction, chunk_bytes=config.chunk_bytes)
    source = open_source(
        config.source,
        config.path,
        text_field=config.text_field,
        on_bad_text=config.on_bad_text,
        max_bytes=config.max_bytes,
        split=config.hf_split,
        data_dir=data_dir,
    )
    root = Path(config.cache_dir).expanduser() if config.cache_dir else default_cache_dir()
    tokenizer = load_tokenizer(
        _tokenizer_spec(config.tokenizer, data_dir),
        documents=source.documents,
        source_digest=source.digest,
        cache_dir=root / "tokenizers",
    )
    cache = build_token_cache(
        source, tokenizer, cache_dir=root / "tokens", ram_budget_bytes=config.ram_budget_bytes
    )
    if cache.skipped:
        logger.warning("data: %d lines/rows of %s skipped as bad text", cache.skipped, source.label)
    return TokenDataset.from_cache(
        cache, tokenizer=tokenizer, val_fraction=config.val_fraction, chunk_tokens=config.chunk_bytes
    )
