"""Item 23: garbage job files and scenario files give a typed error that names the file, never a traceback.

Job files go through :func:`geotrain.config.load_job` (``ConfigError``), scenario
files through :func:`geotrain.cli.plan.load_scenario` (``ScenarioError``), the
emulation topology through :func:`geotrain.emulate.load_topology`; at the
command line, ``geotrain plan`` and ``geotrain run`` exit 2 with one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from geotrain.cli.plan import load_scenario
from geotrain.config import load_job
from geotrain.errors import ConfigError, ScenarioError

GARBAGE: dict[str, bytes] = {
    "binary": bytes(range(256)) * 8,
    "invalid_utf8": b"[job]\nname = \"\xff\xfe\"\n",
    "deep_arrays": b"a = " + b"[" * 200_000,
    "deep_json": b"[" * 200_000,
    "deep_inline_tables": b"a = " + b"{b = " * 50_000,
    "nul_bytes": b"\x00" * 4096,
    "huge_line": b"x" * (4 << 20),
    "nan_and_inf": b'[stop]\nsteps = nan\n[sync]\nouter_lr = inf\n{"regions": NaN}',
    "wrong_types": b'[job]\nname = 5\n[pipeline]\nstages = "many"\n',
    "unknown_section": b"[jobb]\nname = \"x\"\n",
    "json_not_object": b"[1, 2, 3]",
    "json_wrong_shapes": json.dumps({"regions": {"a": 1}, "peers": "all", "links": None, "model": [], "job": 0}).encode(),
    "huge_numbers": b'[job]\nseed = 99999999999999999999999999999999999\n[pipeline]\nmicrobatches = 1e400\n',
}


def _loaders() -> dict[str, tuple[Callable[[str], Any], type[Exception]]]:
    from geotrain.emulate import load_topology

    return {"job": (load_job, ConfigError), "scenario": (load_scenario, ScenarioError),
            "topology": (load_topology, ScenarioError)}


@pytest.mark.parametrize("kind", ["job", "scenario", "topology"])
@pytest.mark.parametrize("case", sorted(GARBAGE))
def test_garbage_file_gives_a_typed_error_naming_the_file(tmp_path: Path, kind: str, case: str) -> None:
    path = tmp_path / f"{case}.input"
    path.write_bytes(GARBAGE[case])
    load, error = _loaders()[kind]
    try:
        load(str(path))
    except error as e:
        assert case in str(e) or str(path) in str(e) or "input" in str(e), e  # says which file
    else:
        # a few are valid by accident (e.g. a job of defaults plus a huge seed); they must then be usable
        assert kind == "job" and case in ("huge_numbers",), f"{case} accepted as a {kind}"


def test_missing_and_directory_paths(tmp_path: Path) -> None:
    for load, error in _loaders().values():
        with pytest.raises(error):
            load(str(tmp_path / "missing.toml"))
        with pytest.raises(error):
            load(str(tmp_path))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=2048))
def test_random_bytes_only_raise_typed_errors(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.input"
    path.write_bytes(data)
    for load, error in _loaders().values():
        try:
            load(str(path))
        except error:
            pass


@pytest.mark.multiprocess
def test_cli_refuses_garbage_with_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "deep.json"
    bad.write_bytes(GARBAGE["deep_json"])
    for args in (["plan", "--scenario", str(bad)], ["run", str(bad), "--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/QmX"]):
        r = subprocess.run([sys.executable, "-m", "geotrain", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (args, r.returncode, r.stderr[-1000:])
        assert "Traceback" not in r.stderr and "deep.json" in r.stderr, r.stderr[-1000:]
