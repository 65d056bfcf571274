"""``geotrain plan`` on the shipped scenarios: the JSON shape, the tables, and clean errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from geotrain.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"


def test_json_shape_carries_what_the_table_shows(capsys):
    assert main(["plan", "--scenario", str(EXAMPLES / "demo.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"plan", "predicted", "baselines", "baseline_reasons", "method", "chosen_from", "notes",
                        "stage_memory_gb", "spare_reasons", "solve_s", "objective", "floor_tokens_per_s"}
    assert out["objective"] == "throughput" and out["floor_tokens_per_s"] is None
    assert set(out["plan"]) == {"pipelines", "spares"}
    keys = {"tokens_per_s", "usd_per_hour", "usd_per_mtok", "step_s", "cross_region_bytes_per_step"}
    table = {"bottleneck", "utilisation", "pipeline_step_s", "round_s", "round_sync_s", "exposed_sync_s"}
    assert set(out["predicted"]) == keys | table
    assert out["predicted"]["bottleneck"]
    assert set(out["baselines"]) == {"random", "round_robin", "greedy_region", "genetic", "uniform_split"}
    assert all(v is None or set(v) == keys for v in out["baselines"].values())
    assert set(out["baseline_reasons"]) == {k for k, v in out["baselines"].items() if v is None}
    assert set(out["spare_reasons"]) == set(out["plan"]["spares"])
    assert all(out["spare_reasons"].values())
    used = {st["peer"] for pipe in out["plan"]["pipelines"] for st in pipe}
    assert set(out["predicted"]["utilisation"]) == used
    for pipe, mem in zip(out["plan"]["pipelines"], out["stage_memory_gb"], strict=True):
        assert pipe[0]["layers"][0] == 0 and pipe[-1]["layers"][1] == 26
        assert all(set(st) == {"peer", "layers"} for st in pipe)
        assert len(mem) == len(pipe) and all(0 < m["need"] <= m["have"] for m in mem)


def test_cost_output_names_the_speed_it_kept(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    path = str(EXAMPLES / "heterogeneous_price.json")
    assert main(["plan", "--scenario", path, "--json", "--no-baselines"]) == 0
    fastest = json.loads(capsys.readouterr().out)["predicted"]["tokens_per_s"]
    assert main(["plan", "--scenario", path, "--json", "--no-baselines", "--objective", "cost"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["objective"] == "cost" and out["floor_tokens_per_s"] == pytest.approx(0.9 * fastest)
    assert out["predicted"]["tokens_per_s"] >= out["floor_tokens_per_s"]
    assert main(["plan", "--scenario", path, "--no-baselines", "--objective", "cost"]) == 0
    assert "within 10% of the fastest" in capsys.readouterr().out
    assert main(["plan", "--scenario", path, "--json", "--no-baselines", "--objective", "cost=1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["objective"] == {"cost": 1.0} and out["floor_tokens_per_s"] is None


def test_human_tables(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    assert main(["plan", "--scenario", str(EXAMPLES / "demo.json"), "--objective", "cost"]) == 0
    out = capsys.readouterr().out
    for word in ("pipeline", "region", "tokens/s", "USD/1M tokens", "genetic", "greedy_region", "bytes per inner step"):
        assert word in out


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.json")))
def test_every_example_plans(name, capsys):
    assert main(["plan", "--scenario", str(EXAMPLES / name), "--json", "--no-baselines", "--time-budget", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["predicted"]["tokens_per_s"] > 0 and out["baselines"] == {}


def test_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    d = json.loads((EXAMPLES / "demo.json").read_text())
    d["peers"][0]["memory_gb"] = "lots"
    bad.write_text(json.dumps(d))
    assert main(["plan", "--scenario", str(bad)]) == 2
    assert "peers[0].memory_gb must be a number" in capsys.readouterr().err
    assert main(["plan", "--scenario", str(tmp_path / "missing.json")]) == 2
    assert "cannot read scenario" in capsys.readouterr().err
    d = json.loads((EXAMPLES / "demo.json").read_text())
    d["links"] = [ln for ln in d["links"] if ln["a"] == ln["b"]]
    bad.write_text(json.dumps(d))
    assert main(["plan", "--scenario", str(bad)]) == 2
    assert "regions are disconnected" in capsys.readouterr().err
