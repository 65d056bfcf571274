"""Scenario parsing: the one entry point, and errors that name the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from geotrain.errors import ScenarioError
from geotrain.planner import Objective, Scenario, transformer_profile
from geotrain.planner.codecs import compression_ratio

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"
DEMO = json.loads((EXAMPLES / "demo.json").read_text())


def test_demo_parses_with_transformer_profile():
    sc = Scenario.from_dict(DEMO)
    assert len(sc.model.profile) == 24 + 2
    assert sc.job.objective == Objective(kind="throughput")
    assert sc.link("eu-0", "us-1").bandwidth_gbps == 1.16
    assert sc.link("eu-0", "eu-1").rtt_ms == 5


def test_peer_links_override_region_links():
    d = copy.deepcopy(DEMO)
    d["links"].append({"a": "eu-0", "b": "us-1", "bandwidth_gbps": 0.1, "rtt_ms": 200})
    sc = Scenario.from_dict(d)
    assert sc.link("us-1", "eu-0").bandwidth_gbps == 0.1
    assert sc.link("eu-1", "us-1").bandwidth_gbps == 1.16
    assert sc.has_peer_links


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d["peers"][0].pop("tflops"), r"peers\[0\]\.tflops is required"),
        (lambda d: d["peers"][1].update(region="mars"), r"peers\[eu-1\]\.region 'mars'"),
        (lambda d: d["peers"][0].update(memory_gb=-1), r"peers\[0\]\.memory_gb must be > 0"),
        (lambda d: d["peers"].append(dict(d["peers"][0])), "duplicate id 'eu-0'"),
        (lambda d: d["links"][0].update(bandwidth_gbps=0), r"links\[0\]\.bandwidth_gbps must be > 0"),
        (lambda d: d["links"][0].update(b="nowhere"), r"links\[0\]: 'nowhere' is neither"),
        (lambda d: d["links"].append({"a": "eu-0", "b": "us-east", "bandwidth_gbps": 1, "rtt_ms": 1}),
         "both be regions or both be peer ids"),
        (lambda d: d["job"].update(activation_codec="zip"), "job.activation_codec: unknown codec 'zip'"),
        (lambda d: d["job"].update(objective={"max_usd_per_hour": -1}), "job.objective"),
        (lambda d: d["job"].update(objective="fastest"), "job.objective: objective must be one of"),
        (lambda d: d["job"].update(micro_batches=0), r"job\.micro_batches must be > 0"),
        (lambda d: d["job"].update(stagse=2), r"job: unknown field\(s\) \['stagse'\]"),
        (lambda d: d["model"].pop("hidden"), "model.hidden is required"),
        (lambda d: d.update(peers=[]), "peers is empty"),
        (lambda d: d.update(regions={}), "regions must be a non-empty object"),
    ],
)
def test_errors_name_the_field(mutate, field):
    d = copy.deepcopy(DEMO)
    mutate(d)
    with pytest.raises(ScenarioError, match=field):
        Scenario.from_dict(d)


def test_scenario_error_is_a_value_error():
    with pytest.raises(ValueError):
        Scenario.from_dict({"regions": {}})


def test_explicit_profile_round_trip():
    prof = transformer_profile(layers=2, hidden=64, seq_len=32, vocab=256, dtype_bytes=4)
    d = copy.deepcopy(DEMO)
    d["model"] = {"profile": [vars(lp) for lp in prof], "seq_len": 32, "dtype_bytes": 4}
    sc = Scenario.from_dict(d)
    assert list(sc.model.profile) == prof


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("cost", Objective(kind="cost")),
        ("max_usd_per_hour=40", Objective(kind="max_usd_per_hour", value=40.0)),
        ('{"min_tokens_per_s": 5000}', Objective(kind="min_tokens_per_s", value=5000.0)),
        ({"max_usd_per_hour": 3}, Objective(kind="max_usd_per_hour", value=3.0)),
        (None, Objective(kind="throughput")),
    ],
)
def test_objective_parse(raw, expected):
    assert Objective.parse(raw) == expected


def test_transformer_profile_formulas():
    prof = transformer_profile(layers=12, hidden=768, seq_len=1024, vocab=50257, dtype_bytes=2)
    assert len(prof) == 14
    h, t, v = 768, 1024, 50257
    assert prof[1].flops_per_token == 72 * h * h + 12 * t * h
    assert prof[1].param_bytes == (12 * h * h + 13 * h) * 2
    assert prof[0].param_bytes == (v * h + t * h) * 2
    assert prof[-1].activation_bytes_per_token == 0 and prof[5].activation_bytes_per_token == h * 2
    # GPT-2 small with an untied head: 124M (tied) + 38.6M
    assert sum(p.param_bytes for p in prof) / 2 == pytest.approx(163.0e6, rel=0.01)


def test_codec_table_matches_the_compression_library():
    torch = pytest.importorskip("torch")
    compression = pytest.importorskip("geotrain.compression")
    for spec in ("none", "fp16", "bf16", "int8", "int8:block=64", "int8:block=64,scale=fp32", "int4",
                 "int4:block=32", "topk:fraction=0.01", "topk:fraction=0.05,values=fp16"):
        for dtype, nbytes in ((torch.float32, 4), (torch.bfloat16, 2)):
            lib = compression.get_codec(spec).estimate_ratio(1 << 20, dtype)
            assert compression_ratio(spec, nbytes) == pytest.approx(lib, rel=1e-3), (spec, dtype)


def test_cost_objective_takes_a_slowdown_bound():
    from geotrain.errors import ConfigError
    from geotrain.planner import Objective

    assert Objective.parse("cost=0.1") == Objective(kind="cost", value=0.1)
    # "cost" alone is cost=0.1; cost=1 gives up any speed (the cheapest tokens at any speed)
    assert Objective.parse("cost").slowdown == 0.1 and Objective.parse("cost=1").slowdown == 1.0
    assert Objective.parse("throughput").slowdown is None
    for bad in ({"cost": 2}, "cost=0", "cost=inf"):
        with pytest.raises(ConfigError, match="0 < s <= 1"):
            Objective.parse(bad)
