from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from geotrain.data import DataConfig, ReadStats, build_dataset, open_source
from geotrain.data.sources import PIECE_BYTES, find_files
from geotrain.errors import ConfigError, DataError
from tests.data.conftest import sentence, write_jsonl

TEXTS = [sentence(i) for i in range(60)]


def docs(kind: str, path: Path | str, **kw: object) -> list[str]:
    return list(open_source(kind, str(path), **kw).documents())  # type: ignore[arg-type]


def test_text_files_directory_and_glob_in_sorted_order(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "2.txt").write_text("two\n")
    (tmp_path / "a.txt").write_text("one\nline two\n")
    (tmp_path / "c.md").write_text("not text")
    assert docs("text", tmp_path) == ["one\nline two\n", "two\n"]
    assert docs("text", tmp_path / "a.txt") == ["one\nline two\n"]
    assert docs("text", tmp_path / "**" / "*.txt") == ["one\nline two\n", "two\n"]
    assert docs("text", tmp_path / "*.md") == ["not text"]
    assert [f.rel for f in find_files("text", str(tmp_path))] == ["a.txt", "b/2.txt"]


def test_long_text_file_comes_in_pieces_of_one_document(tmp_path: Path) -> None:
    line = "ünïcode line " * 20 + "\n"
    n = PIECE_BYTES // len(line.encode()) * 3
    (tmp_path / "big.txt").write_text(line * n + "x" * (PIECE_BYTES + 5))  # and one line longer than a piece
    stats = ReadStats()
    pieces = list(open_source("text", str(tmp_path / "big.txt")).pieces(stats))
    assert len(pieces) > 3 and [end for _, end in pieces] == [False] * (len(pieces) - 1) + [True]
    assert "".join(t for t, _ in pieces) == line * n + "x" * (PIECE_BYTES + 5)
    assert stats.documents == 1 and stats.bytes_read == (tmp_path / "big.txt").stat().st_size


def test_jsonl_parquet_and_saved_dataset_yield_the_same_documents(tmp_path: Path) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_jsonl(tmp_path / "j" / "0.jsonl", TEXTS[:30])
    write_jsonl(tmp_path / "j" / "1.jsonl", TEXTS[30:])
    assert docs("jsonl", tmp_path / "j") == TEXTS
    assert docs("jsonl", tmp_path / "j" / "*.jsonl") == TEXTS
    (tmp_path / "p").mkdir()
    pq.write_table(
        pa.table({"body": TEXTS[:40], "n": list(range(40))}), tmp_path / "p" / "a.parquet", row_group_size=7
    )
    pq.write_table(pa.table({"body": TEXTS[40:]}), tmp_path / "p" / "b.parquet")
    assert docs("parquet", tmp_path / "p", text_field="body") == TEXTS
    datasets.Dataset.from_dict({"text": TEXTS}).save_to_disk(str(tmp_path / "saved"))
    assert docs("hf_disk", tmp_path / "saved") == TEXTS
    splits = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": TEXTS}),
            "test": datasets.Dataset.from_dict({"text": ["x"]}),
        }
    )
    splits.save_to_disk(str(tmp_path / "dict"))
    assert docs("hf_disk", tmp_path / "dict", split="test") == ["x"]
    with pytest.raises(DataError, match="no split 'dev'"):
        docs("hf_disk", tmp_path / "dict", split="dev")


def test_every_source_builds_a_dataset(tmp_path: Path, cache_root: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    write_jsonl(tmp_path / "d.jsonl", TEXTS)
    pq.write_table(pa.table({"text": TEXTS}), tmp_path / "d.parquet")
    (tmp_path / "t").mkdir()
    for i, t in enumerate(TEXTS):
        (tmp_path / "t" / f"{i:03}.txt").write_text(t)
    base = dict(tokenizer="bpe:300", cache_dir=str(cache_root), chunk_bytes=64)
    built = {
        kind: build_dataset(DataConfig(source=kind, path=str(p), **base))  # type: ignore[arg-type]
        for kind, p in (
            ("jsonl", tmp_path / "d.jsonl"),
            ("parquet", tmp_path / "d.parquet"),
            ("text", tmp_path / "t"),
        )
    }
    for kind, ds in built.items():
        assert ds.stats.documents == len(TEXTS), kind
        assert ds.vocab_size == ds.tokenizer.vocab_size <= 300
        text = ds.tokenizer.decode(ds.tokens[:200])
        assert text.startswith(TEXTS[0] + "<|endoftext|>" + TEXTS[1]), kind
    # the same documents: the same tokens (the tokenizers differ only if the digests do)
    assert built["jsonl"].tokens.tolist() == built["parquet"].tokens.tolist()
    stdlib = build_dataset(
        DataConfig(
            source="stdlib",
            tokenizer="bpe:600",
            max_bytes=64 << 10,
            **{k: v for k, v in base.items() if k != "tokenizer"},
        )
    )
    assert stdlib.stats.files >= 1 and "import" in stdlib.tokenizer.decode(stdlib.tokens[:3000])


def test_source_digest_names_content_not_location(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "here" / "d.jsonl", TEXTS)
    shutil.copytree(tmp_path / "here", tmp_path / "there")
    a = open_source("jsonl", str(tmp_path / "here"))
    b = open_source("jsonl", "d.jsonl", data_dir=tmp_path / "there")
    assert a.digest == b.digest and len(a.digest) == 64
    assert (
        open_source("jsonl", str(tmp_path / "here"), max_bytes=100).digest != a.digest
    )  # read settings count
    write_jsonl(tmp_path / "there" / "d.jsonl", TEXTS[:-1] + ["changed"])
    assert open_source("jsonl", "d.jsonl", data_dir=tmp_path / "there").digest != a.digest


def test_data_dir_remaps_relative_paths(tmp_path: Path, cache_root: Path) -> None:
    write_jsonl(tmp_path / "peer1" / "corpus" / "d.jsonl", TEXTS)
    shutil.copytree(tmp_path / "peer1", tmp_path / "peer2")
    train_bpe_dir = tmp_path / "peer1" / "tok"
    first = build_dataset(
        DataConfig(source="jsonl", path="corpus", tokenizer="bpe:300", cache_dir=str(cache_root)),
        data_dir=str(tmp_path / "peer1"),
    )
    first.tokenizer.save(train_bpe_dir)
    shutil.copytree(train_bpe_dir, tmp_path / "peer2" / "tok")
    cfg = DataConfig(source="jsonl", path="corpus", tokenizer="tok", cache_dir=str(cache_root / "other"))
    one = build_dataset(cfg, data_dir=str(tmp_path / "peer1"))
    two = build_dataset(cfg, data_dir=str(tmp_path / "peer2"))
    assert one.digest == two.digest == first.digest
    assert one.tokenizer.digest == first.tokenizer.digest
    with pytest.raises(DataError, match="does not exist"):
        build_dataset(cfg, data_dir=str(tmp_path / "nowhere"))


def test_missing_paths_and_empty_globs_and_corpora(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist") as e:
        docs("jsonl", tmp_path / "nope.jsonl")
    assert "nope.jsonl" in str(e.value)
    with pytest.raises(DataError, match="matches no files"):
        docs("parquet", tmp_path / "*.parquet")
    with pytest.raises(DataError, match=r"no \*\.jsonl files"):
        docs("jsonl", tmp_path)
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match="is empty"):
        docs("jsonl", tmp_path / "blank.jsonl")
    with pytest.raises(DataError, match="not a file"):
        docs("hf_disk", tmp_path / "blank.jsonl")
    with pytest.raises(ConfigError, match="data.source must be"):
        open_source("csv", str(tmp_path))


def test_jsonl_errors_name_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "rows.jsonl"
    f.write_text('{"text": "ok"}\n\n{"text": "fine"}\n{"text": oops}\n')
    with pytest.raises(DataError, match=r"rows\.jsonl:4: not JSON"):
        docs("jsonl", f)
    f.write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(DataError, match=r"rows\.jsonl:2: the record has no field 'text'"):
        docs("jsonl", f)
    f.write_text('{"text": "ok"}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"rows\.jsonl:2: .*no field"):
        docs("jsonl", f)
    f.write_text('{"text": 5}\n')
    with pytest.raises(DataError, match=r"rows\.jsonl:1: field 'text' is int, not a string"):
        docs("jsonl", f)


def test_bad_utf8_is_skipped_and_counted_or_an_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, cache_root: Path
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    j = tmp_path / "j" / "rows.jsonl"
    j.parent.mkdir()
    j.write_bytes(
        b'{"text": "good one"}\n{"text": "bad \xff\xfe"}\n{"text": "good two"}\n{"text": "\\ud800"}\n'
    )
    stats = ReadStats()
    with caplog.at_level(logging.WARNING, logger="geotrain.data.sources"):
        got = [t for t, _ in open_source("jsonl", str(j)).pieces(stats)]
    assert got == ["good one", "good two"] and stats.skipped == 2 and "rows.jsonl:2" in caplog.text
    with pytest.raises(DataError, match=r"rows\.jsonl:2: not valid UTF-8"):
        docs("jsonl", j, on_bad_text="error")
    t = tmp_path / "t" / "notes.txt"
    t.parent.mkdir()
    t.write_bytes(b"fine line\nbroken \xc3\x28 line\nlast line\n")
    assert docs("text", t) == ["fine line\nlast line\n"]
    with pytest.raises(DataError, match=r"notes\.txt:2: not valid UTF-8"):
        docs("text", t, on_bad_text="error")
    p = tmp_path / "p" / "rows.parquet"
    p.parent.mkdir()
    pq.write_table(pa.table({"text": pa.array([b"ok", b"\xff", None, b"also ok"], type=pa.binary())}), p)
    assert docs("parquet", p) == ["ok", "also ok"]
    with pytest.raises(DataError, match=r"rows\.parquet: row 1: not valid UTF-8"):
        docs("parquet", p, on_bad_text="error")
    ds = build_dataset(DataConfig(source="jsonl", path=str(j), cache_dir=str(cache_root), val_fraction=0.3))
    assert ds.stats.skipped == 2 and ds.stats.documents == 2
    assert ds.tokenizer.decode(ds.tokens) == "good onegood two"  # bytes: no EOS, documents joined as they are


def test_parquet_column_problems_name_the_file(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "a.parquet")
    with pytest.raises(DataError, match=r"a\.parquet: no column 'text'.*\['body'\]"):
        docs("parquet", tmp_path / "a.parquet")
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "n.parquet")
    with pytest.raises(DataError, match=r"n\.parquet: column 'text' is int64, not text"):
        docs("parquet", tmp_path / "n.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"junk\.parquet: not a readable parquet file"):
        docs("parquet", tmp_path / "junk.parquet")
    (tmp_path / "nodataset").mkdir()
    (tmp_path / "nodataset" / "x.txt").write_text("x")
    with pytest.raises(DataError, match="not a dataset saved with save_to_disk"):
        docs("hf_disk", tmp_path / "nodataset")


def test_max_bytes_stops_after_the_record_that_reaches_it(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", TEXTS)
    line = len((tmp_path / "d.jsonl").read_bytes().splitlines(keepends=True)[0])
    stats = ReadStats()
    got = [
        t for t, _ in open_source("jsonl", str(tmp_path / "d.jsonl"), max_bytes=line * 3 + 1).pieces(stats)
    ]
    assert got == TEXTS[:4] and stats.documents == 4


def test_too_few_tokens_for_a_batch(tmp_path: Path, cache_root: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", ["tiny", "docs"])
    ds = build_dataset(DataConfig(source="jsonl", path=str(tmp_path / "d.jsonl"), cache_dir=str(cache_root)))
    with pytest.raises(DataError, match="fewer tokens than one batch"):
        ds.get_batch(0, batch_size=1, seq_len=64, seed=0)
    write_jsonl(tmp_path / "one.jsonl", ["x"])
    with pytest.raises(DataError, match="fewer tokens than one batch"):
        build_dataset(DataConfig(source="jsonl", path=str(tmp_path / "one.jsonl"), cache_dir=str(cache_root)))


def test_config_validation_of_the_new_fields() -> None:
    with pytest.raises(ConfigError, match="bpe:N"):
        DataConfig(tokenizer="bpe:x")
    with pytest.raises(ConfigError, match="on_bad_text"):
        DataConfig(on_bad_text="ignore")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="byte tokens only"):
        DataConfig(source="hf", path="x", tokenizer="bpe:300")
    with pytest.raises(ConfigError, match="text_field"):
        DataConfig(source="jsonl", path="x", text_field="")
    with pytest.raises(ConfigError, match="needs data.path"):
        DataConfig(source="parquet")
    assert DataConfig().is_byte_default and DataConfig(source="text", path="a").is_byte_default
    assert not DataConfig(source="text", path="*.txt").is_byte_default
    assert not DataConfig(source="jsonl", path="a").is_byte_default
    json.dumps(DataConfig().__dict__)  # plain values only: the config travels in the job record


def test_digest_leaves_out_files_past_the_byte_budget(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", TEXTS[:20])
    size = (tmp_path / "a.jsonl").stat().st_size
    before = open_source("jsonl", str(tmp_path), max_bytes=size).digest
    write_jsonl(tmp_path / "b.jsonl", TEXTS[20:])  # sorts after a.jsonl, starts past the budget
    assert open_source("jsonl", str(tmp_path), max_bytes=size).digest == before
    assert open_source("jsonl", str(tmp_path), max_bytes=size + 1).digest != before  # now b.jsonl is read
    assert docs("jsonl", tmp_path, max_bytes=size) == TEXTS[:20]


def test_saved_dataset_column_problems(tmp_path: Path) -> None:
    import datasets

    datasets.Dataset.from_dict({"body": ["x"], "n": [1]}).save_to_disk(str(tmp_path / "a"))
    with pytest.raises(
        DataError, match=r"has no column 'text' \(data.text_field\); columns are \['body', 'n'\]"
    ):
        docs("hf_disk", tmp_path / "a")
    with pytest.raises(DataError, match="column 'n' is .*not text"):
        docs("hf_disk", tmp_path / "a", text_field="n")
    assert docs("hf_disk", tmp_path / "a", text_field="body") == ["x"]
    with pytest.raises(DataError, match="not a glob"):
        docs("hf_disk", tmp_path / "*")
