"""Reading the regions/links part of a scenario."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from geotrain.emulate import load_topology, topology_from_dict, topology_from_scenario
from geotrain.errors import ScenarioError

SCENARIO: dict[str, Any] = {
    "regions": {"us-east": {"egress_usd_per_gb": 0.02}, "eu-west": {}, "ap-south": {}},
    "links": [
        {"a": "us-east", "b": "eu-west", "bandwidth_gbps": 1.16, "rtt_ms": 76},
        {"a": "us-east", "b": "us-east", "bandwidth_gbps": 2, "rtt_ms": 5},
        {"a": "p0", "b": "eu-west", "bandwidth_gbps": 0.1, "rtt_ms": 90},
    ],
    "peers": [{"id": "p0", "region": "us-east"}],
}


def test_regions_and_links_parse_in_bytes_and_seconds(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SCENARIO))
    topo = load_topology(path)
    assert topo.regions == ("us-east", "eu-west", "ap-south")
    link = topo.link("us-east", "eu-west")
    assert link is not None and link is topo.link("eu-west", "us-east")
    assert link.bandwidth_bps == pytest.approx(1.16e9 / 8)
    assert link.one_way_delay_s == pytest.approx(0.038)
    assert topo.link("ap-south", "us-east") is None
    # the per-peer override (p0) is for the planner, not for region emulation
    assert set(topo.links) == {("eu-west", "us-east"), ("us-east", "us-east")}


@pytest.mark.parametrize(
    ("scenario", "match"),
    [
        ({"links": []}, "regions"),
        ({"regions": {}}, "no regions"),
        ({"regions": {"a b": {}}}, "region name"),
        ({"regions": {"a": {}, "b": {}}, "links": [{"a": "a", "b": "b", "rtt_ms": 3}]}, "bandwidth_gbps"),
        ({"regions": {"a": {}, "b": {}}, "links": [{"a": "a", "b": "b", "bandwidth_gbps": 0, "rtt_ms": 3}]}, "> 0"),
        ({"regions": {"a": {}, "b": {}}, "links": [{"a": "a", "b": "b", "bandwidth_gbps": 1, "rtt_ms": -3}]}, ">= 0"),
        (
            {"regions": {"a": {}, "b": {}}, "links": [
                {"a": "a", "b": "b", "bandwidth_gbps": 1, "rtt_ms": 3},
                {"a": "b", "b": "a", "bandwidth_gbps": 1, "rtt_ms": 3}]},
            "repeats",
        ),
        ({"regions": {"a": {}}, "links": {"a": 1}}, "list"),
    ],
)
def test_bad_scenarios_say_what_to_fix(scenario: dict[str, object], match: str) -> None:
    with pytest.raises(ScenarioError, match=match):
        topology_from_dict(scenario)


def test_unreadable_files_are_scenario_errors(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_topology(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ScenarioError, match="not valid JSON"):
        load_topology(bad)


def test_same_view_from_the_planners_parsed_scenario() -> None:
    scenario_mod = pytest.importorskip("geotrain.planner.scenario")
    full = {
        "regions": SCENARIO["regions"],
        "links": [*SCENARIO["links"][:2], {"a": "p0", "b": "p1", "bandwidth_gbps": 0.1, "rtt_ms": 90}],
        "peers": [
            {"id": "p0", "region": "us-east", "tflops": 10, "memory_gb": 16},
            {"id": "p1", "region": "eu-west", "tflops": 10, "memory_gb": 16},
        ],
        "model": {"layers": 4, "hidden": 64, "seq_len": 32, "vocab": 100, "dtype_bytes": 2},
    }
    # the same file feeds the planner and the emulator; both must see the same regions and region links
    parsed = scenario_mod.Scenario.from_dict(full)
    assert topology_from_scenario(parsed) == topology_from_dict(full)
    assert topology_from_dict(full).link("us-east", "eu-west") is not None
