from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from geotrain.data import (
    ByteTokenizer,
    build_token_cache,
    load_tokenizer,
    open_source,
    token_dtype,
    train_bpe,
)
from geotrain.data.tokenizer import HFTokenizer
from geotrain.errors import ConfigError
from tests.data.conftest import sentence, write_jsonl

TEXTS = [sentence(i, n=30) for i in range(300)]


def expected_tokens(tok: HFTokenizer | ByteTokenizer, texts: list[str]) -> list[int]:
    """The token file's contents computed directly: each document's ids, EOS between documents."""
    out: list[int] = []
    for i, t in enumerate(texts):
        if i and tok.eos_id is not None:
            out.append(tok.eos_id)
        ids = tok.encode(t)
        out.extend(ids.tolist() if hasattr(ids, "tolist") else ids)
    return out


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "data" / "d.jsonl", TEXTS)


def test_dtype_follows_the_vocabulary() -> None:
    assert [token_dtype(v).name for v in (256, 257, 65536, 65537, 1 << 32)] == [
        "uint8",
        "uint16",
        "uint16",
        "uint32",
        "uint32",
    ]
    with pytest.raises(ConfigError):
        token_dtype((1 << 32) + 1)


def test_token_file_holds_documents_with_eos_between(corpus: Path, tmp_path: Path) -> None:
    source = open_source("jsonl", str(corpus))
    tok = train_bpe(source.documents(), 500)
    cache = build_token_cache(source, tok, cache_dir=tmp_path / "tokens")
    tokens = cache.tokens()
    assert tokens.dtype == np.uint16 and cache.dtype == "uint16"
    assert tokens.tolist() == expected_tokens(tok, TEXTS)
    assert cache.documents == len(TEXTS) and cache.num_tokens == len(tokens) and not cache.reused
    assert cache.path.stat().st_size == 2 * cache.num_tokens
    import hashlib

    assert cache.digest == hashlib.sha256(cache.path.read_bytes()).hexdigest()
    meta = json.loads(cache.meta_path.read_text())
    assert meta["digest"] == cache.digest and meta["tokenizer_digest"] == tok.digest
    assert meta["source_digest"] == source.digest
    again = build_token_cache(open_source("jsonl", str(corpus)), tok, cache_dir=tmp_path / "tokens")
    assert again.reused and again.digest == cache.digest and again.path == cache.path
    assert not [p for p in (tmp_path / "tokens").iterdir() if p.name.endswith(".tmp")]


def test_uint32_tokens_for_a_large_vocabulary(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(70_000)]
    vocab = {"[UNK]": 0, "</s>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(str(tmp_path / "tokenizer.json"))
    assert tok.vocab_size == 70_002 and tok.eos_id == 1
    docs = ["w0 w69999 w65536", "w12 nope"]
    write_jsonl(tmp_path / "d.jsonl", docs)
    cache = build_token_cache(
        open_source("jsonl", str(tmp_path / "d.jsonl")), tok, cache_dir=tmp_path / "tokens"
    )
    assert cache.tokens().dtype == np.uint32
    assert cache.tokens().tolist() == [2, 70001, 65538, 1, 14, 0]


def test_a_corpus_larger_than_the_ram_budget_is_written_in_bounded_pieces(
    corpus: Path, tmp_path: Path
) -> None:
    source = open_source("jsonl", str(corpus))
    tok = ByteTokenizer()
    budget = 4096
    total = sum(len(t.encode()) for t in TEXTS)
    assert total > 10 * budget
    cache = build_token_cache(source, tok, cache_dir=tmp_path / "tokens", ram_budget_bytes=budget)
    assert 0 < cache.max_write_bytes <= budget // 2  # the write buffer is half the budget
    assert cache.num_tokens == total and cache.tokens().dtype == np.uint8
    assert bytes(cache.tokens()) == "".join(TEXTS).encode()
    # the same tokens whatever the budget
    big = build_token_cache(source, tok, cache_dir=tmp_path / "other", ram_budget_bytes=64 << 20)
    assert big.digest == cache.digest and big.max_write_bytes == total
    with pytest.raises(ConfigError, match="RAM budget"):
        build_token_cache(source, tok, cache_dir=tmp_path / "x", ram_budget_bytes=10)


def test_truncated_or_corrupted_cache_is_rebuilt(corpus: Path, tmp_path: Path) -> None:
    source = open_source("jsonl", str(corpus))
    tok = train_bpe(source.documents(), 400)
    folder = tmp_path / "tokens"
    good = build_token_cache(source, tok, cache_dir=folder)
    data = good.path.read_bytes()

    good.path.write_bytes(data[:-6])  # truncated
    fixed = build_token_cache(source, tok, cache_dir=folder)
    assert not fixed.reused and fixed.path.read_bytes() == data and fixed.digest == good.digest

    flipped = bytearray(data)
    flipped[10] ^= 0xFF  # same size, other content: the sha256 check catches it
    good.path.write_bytes(bytes(flipped))
    assert build_token_cache(source, tok, cache_dir=folder, verify=False).reused  # size alone cannot tell
    fixed = build_token_cache(source, tok, cache_dir=folder)
    assert not fixed.reused and fixed.path.read_bytes() == data

    good.meta_path.write_text("{broken")
    fixed = build_token_cache(source, tok, cache_dir=folder)
    assert not fixed.reused and fixed.digest == good.digest
    good.meta_path.unlink()
    assert not build_token_cache(source, tok, cache_dir=folder).reused
    assert build_token_cache(source, tok, cache_dir=folder).reused


def test_cache_is_keyed_by_source_and_tokenizer(corpus: Path, tmp_path: Path) -> None:
    folder = tmp_path / "tokens"
    source = open_source("jsonl", str(corpus))
    a = build_token_cache(source, ByteTokenizer(), cache_dir=folder)
    b = build_token_cache(source, train_bpe(source.documents(), 300), cache_dir=folder)
    c = build_token_cache(
        open_source("jsonl", str(corpus), max_bytes=1000), ByteTokenizer(), cache_dir=folder
    )
    assert len({a.path, b.path, c.path}) == 3 and c.num_tokens < a.num_tokens
    assert not (a.reused or b.reused or c.reused)


def test_progress_is_logged_when_stderr_is_not_a_terminal(
    corpus: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    with caplog.at_level(logging.INFO, logger="geotrain.data.cache"):
        build_token_cache(
            open_source("jsonl", str(corpus)),
            ByteTokenizer(),
            cache_dir=tmp_path / "t",
            ram_budget_bytes=8192,
        )
    assert "bytes read" in caplog.text and "token cache:" in caplog.text


def test_processes_sharing_a_cache_build_it_once(corpus: Path, tmp_path: Path) -> None:
    import threading

    source = open_source("jsonl", str(corpus))
    tok = ByteTokenizer()
    folder = tmp_path / "shared"
    results: list[object] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            results.append(build_token_cache(open_source("jsonl", str(corpus)), tok, cache_dir=folder))
        except BaseException as e:  # surfaced below; a thread's exception is otherwise lost
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(results) == 3
    reused = sorted(r.reused for r in results)  # type: ignore[attr-defined]
    assert reused == [False, True, True]  # one built it; the others waited on the lock and reused it
    assert len({r.digest for r in results}) == 1  # type: ignore[attr-defined]
    assert source.digest == results[0].source_digest  # type: ignore[attr-defined]


def test_vocab_size_covers_the_largest_id_of_a_vocabulary_with_gaps(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "</s>": 3, "b": 300}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(str(tmp_path / "tokenizer.json"))
    assert tok.vocab_size == 301 and tok.eos_id == 3  # 3 entries, ids up to 300
    write_jsonl(tmp_path / "d.jsonl", ["b x b", "b"])
    cache = build_token_cache(open_source("jsonl", str(tmp_path / "d.jsonl")), tok, cache_dir=tmp_path / "t")
    assert cache.dtype == "uint16" and cache.tokens().tolist() == [300, 0, 300, 3, 300]
