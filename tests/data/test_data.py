from __future__ import annotations

import hashlib

import pytest
import torch

from geotrain.data import (
    ByteTokenizer,
    Corpus,
    DataConfig,
    TokenDataset,
    build_dataset,
    hf_corpus,
    stdlib_corpus,
    text_file_corpus,
)
from geotrain.errors import ConfigError

BUDGET = 256 << 10


def test_embedded_corpus_is_deterministic_python_source() -> None:
    a = stdlib_corpus(BUDGET)
    stdlib_corpus.cache_clear()
    b = stdlib_corpus(BUDGET)
    assert a is not b and a.digest == b.digest and torch.equal(a.tokens, b.tokens)
    assert len(a) == BUDGET and a.tokens.dtype == torch.uint8
    assert a.digest == hashlib.sha256(a.tokens.numpy().tobytes()).hexdigest()
    text = ByteTokenizer().decode(a.tokens[:20000])
    assert "def " in text and "import " in text


def test_split_and_shards_partition_the_data() -> None:
    ds = TokenDataset(stdlib_corpus(BUDGET), val_fraction=0.1, chunk_bytes=4096)
    assert ds.train.numel() + ds.val.numel() == BUDGET
    assert ds.val.numel() == pytest.approx(0.1 * BUDGET, rel=0.1)
    # every 10th chunk is validation: chunk 9 starts the validation tokens
    torch.testing.assert_close(ds.val[:4096], stdlib_corpus(BUDGET).tokens[9 * 4096 : 10 * 4096])
    shards = [ds.shard(i, 3) for i in range(3)]
    assert len({s.numel() for s in shards}) == 1
    assert torch.equal(torch.cat(shards), ds.train[: 3 * shards[0].numel()])
    with pytest.raises(ConfigError, match="out of range"):
        ds.shard(3, 3)


def test_batches_are_a_pure_function_of_seed_shard_and_step() -> None:
    ds = TokenDataset(stdlib_corpus(BUDGET))
    kw = dict(batch_size=4, seq_len=16, seed=1, num_shards=2)
    b0 = ds.get_batch(0, shard=0, **kw)
    assert b0.shape == (4, 17) and b0.dtype == torch.int64
    assert torch.equal(b0, ds.get_batch(0, shard=0, **kw))
    assert not torch.equal(b0, ds.get_batch(1, shard=0, **kw))
    assert not torch.equal(b0, ds.get_batch(0, shard=1, **kw))
    it = ds.batches(start_step=5, shard=1, **kw)
    assert torch.equal(next(it), ds.get_batch(5, shard=1, **kw))
    assert torch.equal(next(it), ds.get_batch(6, shard=1, **kw))
    # windows come from the shard: each row occurs in shard 1's bytes
    shard = bytes(ds.shard(1, 2).tolist())
    assert all(bytes(row.tolist()) in shard for row in ds.get_batch(3, shard=1, **kw))
    val = ds.val_batches(batch_size=2, seq_len=16, num_batches=3)
    assert len(val) == 3 and all(v.shape == (2, 17) for v in val)
    assert all(torch.equal(a, b) for a, b in zip(val, ds.val_batches(batch_size=2, seq_len=16, num_batches=3), strict=True))


def test_shard_too_small_says_what_to_do() -> None:
    ds = TokenDataset(Corpus.from_bytes("t", b"x" * 100))
    with pytest.raises(ConfigError, match="fewer pipelines"):
        ds.get_batch(0, batch_size=1, seq_len=60, seed=0, shard=0, num_shards=2)


def test_text_file_and_directory_sources(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("hello wörld\n" * 50, encoding="utf-8")
    (tmp_path / "b.txt").write_text("second file\n" * 50, encoding="utf-8")
    one = text_file_corpus(tmp_path / "a.txt")
    assert ByteTokenizer().decode(one.tokens).startswith("hello wörld")
    both = text_file_corpus(tmp_path, max_bytes=700)
    assert len(both) == 700  # a.txt is 650 bytes (ö is two), then 50 bytes of b.txt
    assert ByteTokenizer().decode(both.tokens[650:]) == ("second file\n" * 5)[:50]
    ds = build_dataset(DataConfig(source="text", path=str(tmp_path), chunk_bytes=64))
    assert ds.train.numel() + ds.val.numel() == len(text_file_corpus(tmp_path))
    with pytest.raises(ConfigError, match="does not exist"):
        text_file_corpus(tmp_path / "nope.txt")
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(ConfigError, match="empty"):
        text_file_corpus(tmp_path / "empty.txt")


def test_hf_source_on_a_local_file(tmp_path) -> None:
    pytest.importorskip("datasets")
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "first row"}\n{"text": "second row"}\n')
    corpus = hf_corpus(str(path))
    assert ByteTokenizer().decode(corpus.tokens) == "first row\nsecond row\n"
    with pytest.raises(ConfigError, match="no column"):
        hf_corpus(str(path), text_field="body")


def test_hf_source_without_the_package_is_a_config_error(tmp_path, monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # import now raises ImportError
    with pytest.raises(ConfigError, match="pip install datasets"):
        hf_corpus(str(tmp_path / "x.jsonl"))


def test_config_validation_and_tokenizer() -> None:
    with pytest.raises(ConfigError, match="needs data.path"):
        DataConfig(source="text")
    with pytest.raises(ConfigError, match="val_fraction"):
        DataConfig(val_fraction=0.0)
    with pytest.raises(ConfigError, match="data.source must be"):
        DataConfig(source="web")  # type: ignore[arg-type]
    tok = ByteTokenizer()
    assert tok.decode(tok.encode("é€ ok")) == "é€ ok" and tok.encode("").numel() == 0
