from __future__ import annotations

import json

import pytest

from benchmarks.models import main


@pytest.mark.timeout(120)
def test_models_benchmark_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--d-model", "32", "--layers", "2", "--heads", "2", "--vocab", "64", "--seq-len", "16",
                 "--batch", "2", "--steps", "2", "--repeat", "1"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert {x.get("contender") for x in lines[:3]} == {"gpt", "hf-llama", "hf-llama-native"}
    assert lines[-1]["summary"] and lines[-1]["hf_vs_gpt"] > 0 and lines[-1]["cut_overhead"] > 0
