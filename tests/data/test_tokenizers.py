from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from geotrain.data import ByteTokenizer, HFTokenizer, load_tokenizer, train_bpe
from geotrain.errors import ConfigError
from tests.data.conftest import sentence

DOCS = [sentence(i) for i in range(400)] + ["héllo wörld — ünïcode ✓ 中文"] * 5
SAMPLE = "gamma delta 17. héllo wörld ✓ 中文 zeta\n\tend"


def counted(docs: list[str]) -> tuple[list[int], object]:
    """A documents() callable that counts its calls (a real iterator of ``docs``)."""
    calls = [0]

    def documents() -> Iterator[str]:
        calls[0] += 1
        return iter(docs)

    return calls, documents


def test_bpe_training_is_deterministic_in_process_and_across_processes(tmp_path: Path) -> None:
    a, b = train_bpe(iter(DOCS), 420), train_bpe(iter(DOCS), 420)
    assert a.backend.to_str() == b.backend.to_str() and a.digest == b.digest
    assert a.vocab_size == 420 and a.eos_id == 0 and a.special == {"eos_token": "<|endoftext|>"}
    assert a.decode(a.encode(SAMPLE)) == SAMPLE  # byte-level: every string round-trips
    assert len(a.encode(SAMPLE)) < len(SAMPLE.encode())  # merges learnt something
    other = train_bpe(iter(DOCS[:200]), 420)
    assert other.digest != a.digest
    # fresh interpreters (other hash seeds), one single-threaded, one on four threads, train the same bytes
    (tmp_path / "docs.json").write_text(json.dumps(DOCS))
    code = (
        "import json, sys; from geotrain.data import train_bpe; "
        "docs = json.load(open(sys.argv[1])); print(train_bpe(iter(docs), 420).digest)"
    )
    for env in (
        {"TOKENIZERS_PARALLELISM": "false"},
        {"TOKENIZERS_PARALLELISM": "true", "RAYON_NUM_THREADS": "4"},
    ):
        out = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "docs.json")],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            env={**os.environ, **env, "PYTHONHASHSEED": "12345"},
        )
        assert out.stdout.strip() == a.digest, env


def test_bpe_is_cached_by_source_digest_and_size(cache_root: Path) -> None:
    calls, documents = counted(DOCS)
    first = load_tokenizer("bpe:400", documents=documents, source_digest="d1", cache_dir=cache_root)
    assert calls == [1]
    files = list(cache_root.rglob("tokenizer.json"))
    assert len(files) == 1
    mtime = files[0].stat().st_mtime_ns
    again = load_tokenizer("bpe:400", documents=documents, source_digest="d1", cache_dir=cache_root)
    assert calls == [1], "the second load must reuse the cached tokenizer, not retrain"
    assert again.digest == first.digest and files[0].stat().st_mtime_ns == mtime
    load_tokenizer("bpe:410", documents=documents, source_digest="d1", cache_dir=cache_root)
    load_tokenizer("bpe:400", documents=documents, source_digest="d2", cache_dir=cache_root)
    assert calls == [3] and len(list(cache_root.rglob("tokenizer.json"))) == 3
    # an unreadable cached file is retrained, not trusted
    files[0].write_text("{not json")
    fixed = load_tokenizer("bpe:400", documents=documents, source_digest="d1", cache_dir=cache_root)
    assert calls == [4] and fixed.digest == first.digest
    assert not list(cache_root.rglob("*.tmp"))


def test_tokenizer_json_file_and_directory(tmp_path: Path) -> None:
    bpe = train_bpe(iter(DOCS), 400)
    d = tmp_path / "tok"
    bpe.save(d)
    assert {p.name for p in d.iterdir()} >= {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }
    from_dir = load_tokenizer(str(d))
    from_file = load_tokenizer(str(d / "tokenizer.json"))
    for tok in (from_dir, from_file):
        assert isinstance(tok, HFTokenizer)
        assert tok.encode(SAMPLE) == bpe.encode(SAMPLE) and tok.eos_id == bpe.eos_id
        assert tok.digest == bpe.digest  # same tokenizer wherever it lives
    # a lone tokenizer.json without a config: EOS found among the usual names
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "tokenizer.json").write_text(bpe.backend.to_str())
    assert load_tokenizer(str(lone / "tokenizer.json")).eos_id == 0


def test_directory_without_tokenizer_json_goes_through_transformers(tmp_path: Path) -> None:
    bpe = train_bpe(iter(DOCS), 400)
    d = tmp_path / "gpt2-style"
    d.mkdir()
    bpe.backend.model.save(str(d))  # vocab.json + merges.txt, the "slow" GPT-2 files
    (d / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>"})
    )
    tok = load_tokenizer(str(d))
    assert tok.encode(SAMPLE) == bpe.encode(SAMPLE) and tok.eos_id == 0


def test_eos_from_config_and_none_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", "[END]", "hello", "world"])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    d = tmp_path / "wl"
    d.mkdir()
    backend.save(str(d / "tokenizer.json"))
    with caplog.at_level(logging.WARNING, logger="geotrain.data.tokenizer"):
        plain = load_tokenizer(str(d))
    assert plain.eos_id is None and "no EOS token" in caplog.text
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "[END]", "special": True}}))
    named = load_tokenizer(str(d))
    assert named.eos_id == 1 and named.encode("hello world") == [2, 3]
    assert named.digest != plain.digest  # the EOS is part of what defines it
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<missing>"}))
    with pytest.raises(ConfigError, match="not in its vocabulary"):
        load_tokenizer(str(d))


@pytest.mark.parametrize("kind", ["bpe", "file", "bytes"])
def test_save_loads_with_transformers_and_encodes_the_same_ids(tmp_path: Path, kind: str) -> None:
    transformers = pytest.importorskip("transformers")
    tok: ByteTokenizer | HFTokenizer
    if kind == "bytes":
        tok = ByteTokenizer()
    else:
        tok = train_bpe(iter(DOCS), 400)
        if kind == "file":
            tok.save(tmp_path / "src")
            tok = load_tokenizer(str(tmp_path / "src" / "tokenizer.json"))  # type: ignore[assignment]
    out = tmp_path / "export"
    assert tok.save(out) is True
    auto = transformers.AutoTokenizer.from_pretrained(str(out))
    ids = auto(SAMPLE, add_special_tokens=False)["input_ids"]
    mine = tok.encode(SAMPLE)
    assert ids == (mine.tolist() if isinstance(mine, torch.Tensor) else mine)
    assert auto.decode(ids) == SAMPLE
    if tok.eos_id is not None:
        assert auto.eos_token_id == tok.eos_id
    assert len(auto) == tok.vocab_size


def test_byte_tokenizer_interface() -> None:
    tok = load_tokenizer("bytes")
    assert (
        isinstance(tok, ByteTokenizer)
        and tok.vocab_size == 256
        and tok.eos_id is None
        and tok.name == "bytes"
    )
    assert tok.digest == ByteTokenizer().digest and len(tok.digest) == 64
    assert tok.decode(tok.encode("é€ ok")) == "é€ ok" and tok.decode([104, 105]) == "hi"
    assert [a.tolist() for a in tok.encode_batch(["ab", ""])] == [[97, 98], []]
    with pytest.raises(ValueError, match="0, 255"):
        tok.decode([300])


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("", "must be 'bytes'"),
        ("bpe:many", "bpe:N with N an integer"),
        ("bpe:100", r"\[258, 1048576\]"),
        ("no/such/tokenizer.json", "neither 'bytes', 'bpe:N' nor an existing"),
    ],
)
def test_bad_specs_are_config_errors(spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_tokenizer(spec)


def test_bpe_without_documents_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs documents"):
        load_tokenizer("bpe:300")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{ this is not a tokenizer")
    with pytest.raises(ConfigError, match="could not be read") as e:
        load_tokenizer(str(bad))
    assert str(bad) in str(e.value)
    (tmp_path / "tokenizer_config.json").write_text("[broken")
    with pytest.raises(ConfigError, match="tokenizer_config.json"):
        load_tokenizer(str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="no tokenizer transformers can load"):
        load_tokenizer(str(empty))
