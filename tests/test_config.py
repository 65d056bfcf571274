"""Job files: each kind of mistake gives one clear ConfigError naming the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from geotrain.cli import main
from geotrain.config import job_from_dict, load_job
from geotrain.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "jobs" / "tiny.toml"


def test_example_job_loads_and_round_trips() -> None:
    job = load_job(EXAMPLE)
    assert job_from_dict(job.to_dict()) == job


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[sync]\nevry = 3\n", "unknown key sync.evry; known keys of [sync]"),
        ("[pipline]\nstages = 2\n", "unknown section [pipline]"),
        ("[sync]\nevery = \"ten\"\n", "sync.every must be an integer"),
        ("[pipeline]\nstages = 1.5\n", "pipeline.stages must be"),
        ("[optimizer]\nlr = true\n", "optimizer.lr must be a number"),
        ("[sync]\nevery = 0\n", "sync.every must be > 0"),
        ("[model]\npreset = \"tiny\"\n[pipeline]\nstages = 9\n", "the model has only 6 blocks"),
        ("[model]\npreset = \"huge\"\n", "unknown model preset 'huge'"),
        ("[model]\nd_model = 30\nn_head = 4\n", "must be divisible by model.n_head"),
        ("[sync]\ncodec = \"zip\"\n", "sync.codec: unknown codec 'zip'"),
        ("[sync]\nfragments = 20\nevery = 10\n", "sync.fragments must be in 1..sync.every"),
        ("[data]\nsource = \"text\"\n", "needs data.path"),
        ("[stop]\nsteps = 0\n[objective]\nkind = \"fastest\"\n", "objective.kind must be one of"),
        ("job = 3\n", "[job] must be a table"),
        ("[job]\nname = \"a b\"\n", "job.name must be letters"),
        ("this is = not toml [", "is not valid TOML"),
    ],
)
def test_bad_job_file_gives_one_clear_error(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "job.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_job(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)


def test_missing_job_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read job file"):
        load_job(tmp_path / "nope.toml")


def test_cli_reports_bad_job_file_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.toml"
    path.write_text("[sync]\nevery = -1\n")
    code = main(["run", str(path), "--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N", "--json"])
    assert code == 2
    err = capsys.readouterr().err
    assert "sync.every must be > 0" in err and err.count("\n") == 1
