"""The split/shard/batch view over tokens, checked against the original in-memory implementation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from geotrain.data import DataConfig, TokenDataset, build_dataset, stdlib_corpus
from geotrain.data.dataset import _generator
from tests.data.conftest import sentence, write_jsonl

BUDGET = 256 << 10


class Reference:
    """The split and batches as first written: chunks concatenated into train/val tensors, indexed directly."""

    def __init__(self, tokens: torch.Tensor, *, val_fraction: float = 0.05, chunk: int = 64 << 10) -> None:
        every = max(2, round(1.0 / val_fraction))
        chunks = list(torch.split(tokens, chunk))
        if len(chunks) < every:
            cut = max(1, int(len(tokens) * (1 - val_fraction)))
            self.train, self.val = tokens[:cut], tokens[cut:]
        else:
            self.train = torch.cat([c for i, c in enumerate(chunks) if i % every != every - 1])
            self.val = torch.cat([c for i, c in enumerate(chunks) if i % every == every - 1])

    def shard(self, index: int, num_shards: int) -> torch.Tensor:
        n = self.train.numel() // num_shards
        return self.train[index * n : (index + 1) * n]

    def get_batch(
        self, step: int, *, batch_size: int, seq_len: int, seed: int, shard: int = 0, num_shards: int = 1
    ) -> torch.Tensor:
        data = self.shard(shard, num_shards)
        span = data.numel() - seq_len - 1
        starts = torch.randint(
            0, span + 1, (batch_size,), generator=_generator(seed, shard, num_shards, step)
        )
        idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
        return data[idx].long()

    def val_batches(self, *, batch_size: int, seq_len: int, num_batches: int) -> list[torch.Tensor]:
        n = batch_size * num_batches
        starts = torch.linspace(0, self.val.numel() - seq_len - 1, n).long()
        idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
        return list(self.val[idx].long().split(batch_size))


@pytest.mark.parametrize(
    ("val_fraction", "chunk"), [(0.05, 64 << 10), (0.1, 4096), (0.3, 1000), (0.2, 300_000)]
)
def test_byte_default_batches_are_bitwise_the_original_ones(val_fraction: float, chunk: int) -> None:
    ds = build_dataset(DataConfig(max_bytes=BUDGET, val_fraction=val_fraction, chunk_bytes=chunk))
    ref = Reference(stdlib_corpus(BUDGET).tokens, val_fraction=val_fraction, chunk=chunk)
    assert torch.equal(ds.train, ref.train) and torch.equal(ds.val, ref.val) and ds.train.dtype == torch.uint8
    assert ds.digest == stdlib_corpus(BUDGET).digest and ds.vocab_size == 256 and ds.tokenizer.name == "bytes"
    assert ds.stats.tokens == BUDGET and ds.stats.documents > 0
    for shards in (1, 3):
        for shard in range(shards):
            assert torch.equal(ds.shard(shard, shards), ref.shard(shard, shards))
            for step in (0, 1, 17):
                kw = dict(batch_size=4, seq_len=32, seed=3, shard=shard, num_shards=shards)
                assert torch.equal(ds.get_batch(step, **kw), ref.get_batch(step, **kw))
    got = ds.val_batches(batch_size=3, seq_len=16, num_batches=2)
    assert all(
        torch.equal(a, b)
        for a, b in zip(got, ref.val_batches(batch_size=3, seq_len=16, num_batches=2), strict=True)
    )


def test_memory_mapped_split_matches_the_reference(tmp_path: Path, cache_root: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", [sentence(i, n=40) for i in range(400)])
    cfg = DataConfig(
        source="jsonl",
        path=str(tmp_path / "d.jsonl"),
        tokenizer="bpe:350",
        chunk_bytes=97,
        val_fraction=0.15,
        cache_dir=str(cache_root),
    )
    ds = build_dataset(cfg)
    assert isinstance(ds.tokens, np.memmap) and ds.tokens.dtype == np.uint16
    ref = Reference(torch.from_numpy(np.asarray(ds.tokens, dtype=np.int64)), val_fraction=0.15, chunk=97)
    assert torch.equal(ds.train, ref.train) and torch.equal(ds.val, ref.val)
    assert ds.train.numel() + ds.val.numel() == ds.stats.tokens == len(ds.tokens)
    kw = dict(batch_size=5, seq_len=24, seed=11, num_shards=2)
    for shard in (0, 1):
        b = ds.get_batch(4, shard=shard, **kw)
        assert b.dtype == torch.int64 and b.shape == (5, 25)
        assert torch.equal(b, ref.get_batch(4, shard=shard, **kw))
    assert int(ds.get_batch(0, **{**kw, "batch_size": 64}).max()) < ds.vocab_size
    again = build_dataset(cfg)  # a second build reuses tokenizer and tokens
    assert again.cache is not None and again.cache.reused and again.digest == ds.digest
    assert torch.equal(again.get_batch(9, shard=1, **kw), ds.get_batch(9, shard=1, **kw))


def test_token_dataset_from_a_corpus_keeps_its_constructor() -> None:
    corpus = stdlib_corpus(BUDGET)
    ds = TokenDataset(corpus, val_fraction=0.1, chunk_bytes=4096)
    assert ds.corpus is corpus and ds.cache is None
    torch.testing.assert_close(ds.val[:4096], corpus.tokens[9 * 4096 : 10 * 4096])
