from __future__ import annotations

import json

from benchmarks.pipeline import main


def test_pipeline_benchmark_smoke(capsys) -> None:
    assert main(["--preset", "tiny", "--stages", "2", "--steps", "2", "--warmup", "1", "--mode", "threads",
                 "--microbatches", "2", "--micro-batch", "1"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    result = lines[-1]
    assert result["line"] == "result" and result["stages"] == 2
    for key in ("measured_tokens_per_s", "predicted_tokens_per_s", "predicted_in_run_tokens_per_s",
                "baseline_single_process_tokens_per_s"):
        assert result[key] > 0, key
    assert result["ratio"] == result["measured_tokens_per_s"] / result["predicted_tokens_per_s"]
    assert len(result["bubble_fraction"]) == 2 and all(0 <= b < 1 for b in result["bubble_fraction"])
    # one microbatch of fp32 activations (1 x 32 x 40 x 4 bytes) per microbatch, plus headers
    assert result["bytes_per_hop_per_step"]["0->1"] >= 2 * 32 * 40 * 4
