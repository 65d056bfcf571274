"""Train/validation split, per-pipeline shards and deterministic batches.

What is a *shard*? The slice of the training tokens one pipeline trains on:
the train split cut into ``num_shards`` contiguous, equal slices, one per
pipeline index, so pipelines of a job see disjoint data.

The split is by chunks: the corpus is cut into ``chunk_bytes`` chunks and every
``round(1 / val_fraction)``-th chunk goes to validation, so validation samples
the whole corpus rather than only its last files.

A batch is ``(B, T + 1)`` int64 tokens: inputs are ``[:, :-1]``, targets
``[:, 1:]``. The batch of inner step ``s`` is a pure function of ``(seed,
shard, s)``, so a resumed run and a peer that rebuilds the iterator (say, the
last stage wanting targets) draw the same windows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from geotrain.data.sources import Corpus, hf_corpus, stdlib_corpus, text_file_corpus
from geotrain.errors import ConfigError

__all__ = ["DataConfig", "TokenDataset", "load_corpus", "build_dataset"]


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """Where the data comes from and how it is split. ``source``: "stdlib" (embedded), "text", or "hf"."""

    source: Literal["stdlib", "text", "hf"] = "stdlib"
    path: str | None = None  # text file / directory, or a datasets path or name
    max_bytes: int = 4 << 20
    val_fraction: float = 0.05
    chunk_bytes: int = 64 << 10
    hf_split: str = "train"
    hf_text_field: str = "text"
    hf_name: str | None = None

    def __post_init__(self) -> None:
        if self.source not in ("stdlib", "text", "hf"):
            raise ConfigError(f"data.source must be 'stdlib', 'text' or 'hf'; got {self.source!r}")
        if self.source != "stdlib" and not self.path:
            raise ConfigError(f"data.source = {self.source!r} needs data.path")
        if not isinstance(self.max_bytes, int) or self.max_bytes <= 0:
            raise ConfigError(f"data.max_bytes must be a positive integer; got {self.max_bytes!r}")
        if not 0.0 < self.val_fraction < 0.5:
            raise ConfigError(f"data.val_fraction must be in (0, 0.5); got {self.val_fraction!r}")
        if not isinstance(self.chunk_bytes, int) or self.chunk_bytes < 1:
            raise ConfigError(f"data.chunk_bytes must be a positive integer; got {self.chunk_bytes!r}")


def _generator(*key: int) -> torch.Generator:
    state = np.random.SeedSequence([k & 0xFFFFFFFFFFFFFFFF for k in key]).generate_state(2, np.uint32)
    g = torch.Generator(device="cpu")
    g.manual_seed(int(state[0]) << 32 | int(state[1]))
    return g


class TokenDataset:
    """A corpus split into train/validation tokens (both ``(N,)`` uint8) with batch helpers."""

    def __init__(self, corpus: Corpus, *, val_fraction: float = 0.05, chunk_bytes: int = 64 << 10) -> None:
        self.corpus = corpus
        tokens = corpus.tokens
        every = max(2, round(1.0 / val_fraction))
        chunks = list(torch.split(tokens, chunk_bytes))
        if len(chunks) < every:
            # too small for chunked split: keep the tail as validation
            cut = max(1, int(len(tokens) * (1 - val_fraction)))
            self.train, self.val = tokens[:cut], tokens[cut:]
        else:
            self.train = torch.cat([c for i, c in enumerate(chunks) if i % every != every - 1])
            self.val = torch.cat([c for i, c in enumerate(chunks) if i % every == every - 1])

    def shard(self, index: int, num_shards: int) -> torch.Tensor:
        """Pipeline ``index``'s contiguous slice of the train tokens, ``(N / num_shards,)`` uint8."""
        if not 0 <= index < num_shards:
            raise ConfigError(f"shard index {index} out of range for {num_shards} shards")
        n = self.train.numel() // num_shards
        return self.train[index * n : (index + 1) * n]

    def get_batch(
        self, step: int, *, batch_size: int, seq_len: int, seed: int, shard: int = 0, num_shards: int = 1
    ) -> torch.Tensor:
        """Batch of inner step ``step``: ``(batch_size, seq_len + 1)`` int64 windows of the shard."""
        data = self.shard(shard, num_shards)
        span = data.numel() - seq_len - 1
        if span < 1:
            raise ConfigError(
                f"shard {shard}/{num_shards} has {data.numel()} tokens, fewer than seq_len + 2 = {seq_len + 2}; "
                "use fewer pipelines, a shorter seq_len or more data (data.max_bytes)"
            )
        starts = torch.randint(0, span + 1, (batch_size,), generator=_generator(seed, shard, num_shards, step))
        idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]  # (B, T + 1)
        return data[idx].long()

    def batches(
        self, *, batch_size: int, seq_len: int, seed: int, shard: int = 0, num_shards: int = 1, start_step: int = 0
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
        span = self.val.numel() - seq_len - 1
        if span < 0:
            raise ConfigError(f"validation split has {self.val.numel()} tokens; need more than seq_len + 1")
        starts = torch.linspace(0, span, n).long()
        idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]  # (n, T + 1)
        return list(self.val[idx].long().split(batch_size))


def load_corpus(config: DataConfig) -> Corpus:
    if config.source == "stdlib":
        return stdlib_corpus(config.max_bytes)
    assert config.path is not None
    if config.source == "text":
        return text_file_corpus(config.path, config.max_bytes)
    return hf_corpus(
        config.path,
        split=config.hf_split,
        text_field=config.hf_text_field,
        max_bytes=config.max_bytes,
        name=config.hf_name,
    )


def build_dataset(config: DataConfig | None = None) -> TokenDataset:
    """Load the configured corpus (the embedded one by default) and split it."""
    config = config or DataConfig()
    return TokenDataset(load_corpus(config), val_fraction=config.val_fraction, chunk_bytes=config.chunk_bytes)
