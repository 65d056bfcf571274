"""Pure parts of the end-to-end benchmark: hivemind timeouts from the links, budget points, goals, the summary."""

from __future__ import annotations

import pytest
import torch

from benchmarks import e2e
from benchmarks.contenders.results import ratio, time_to_target


def test_hivemind_timeouts_scale_with_the_links() -> None:
    fast = {"min_bandwidth_bps": float("inf"), "max_rtt_s": 0.0}
    assert e2e.hivemind_timeouts(smoke=False, params=90_480, peers=6, links=fast) == (2.0, 20.0)
    # 1e6 fp16 parameters among 4 peers over 125 kB/s (1 Mbit/s): an all-reduce moves 1.5 * 2e6 B = 24 s
    slow = {"min_bandwidth_bps": 125_000.0, "max_rtt_s": 0.5}
    mm, avg = e2e.hivemind_timeouts(smoke=False, params=1_000_000, peers=4, links=slow)
    assert mm == pytest.approx(5.0)  # 10 RTTs
    assert avg == pytest.approx(4 * 24.0 + 20 * 0.5)


def test_links_and_budget_point() -> None:
    scen = {"regions": {"a": {}, "b": {}, "c": {}},
            "links": [{"a": "a", "b": "b", "bandwidth_gbps": 0.08, "rtt_ms": 40},
                      {"a": "a", "b": "c", "bandwidth_gbps": 0.8, "rtt_ms": 90},
                      {"a": "a", "b": "a", "bandwidth_gbps": 0.001, "rtt_ms": 500}]}
    assert e2e._links(scen) == {"min_bandwidth_bps": pytest.approx(1e7), "max_rtt_s": pytest.approx(0.09)}
    curve = [{"t_s": 0.0, "tokens": 0, "loss": 5.0}, {"t_s": 1.0, "tokens": 100, "loss": 4.0},
             {"t_s": 2.0, "tokens": 200, "loss": 3.0}]
    assert e2e._at_budget(curve, 150) == curve[1]
    assert e2e._at_budget(curve, 200) == curve[2]


def test_goals_and_the_summary_against_flat_diloco_best() -> None:
    lines = {"ddp": {"val_loss_final": 3.0, "time_to_target_s": 20.0, "wall_s": 20.0},
             "diloco": {"val_loss_final": 3.2, "time_to_target_s": None, "wall_s": 8.0},
             "geotrain": {"val_loss_final": 2.9, "time_to_target_s": 4.0, "wall_s": 6.0}}
    curves = {"diloco": [{"t_s": 0.0, "loss": 5.0}, {"t_s": 10.0, "loss": 3.1}, {"t_s": 12.0, "loss": 3.15}],
              "geotrain": [{"t_s": 0.0, "loss": 5.0}, {"t_s": 2.0, "loss": 3.1}, {"t_s": 4.0, "loss": 2.9}]}
    assert e2e._goal("diloco", lines, {}) == 3.0
    assert e2e._goal("geotrain", lines, curves) == 3.0  # DP's loss is the lower one here
    assert e2e._goal("geotrain", {"ddp": {"val_loss_final": 3.5}}, curves) == 3.1  # flat DiLoCo's best is lower
    assert e2e._goal("diloco", {}, {}) is None  # no DP: nothing to train past the budget for
    out = e2e._summary(lines, 3.0, ratio, curves, time_to_target)
    assert out["vs_ddp"]["speedup_to_target"] == pytest.approx(5.0)
    d = out["vs_diloco"]
    assert d["target_loss"] == 3.1 and d["diloco_time_to_best_s"] == 10.0 and d["geotrain_time_to_it_s"] == 2.0
    assert d["speedup_to_target"] == pytest.approx(5.0)
    assert set(d) >= {"speedup_to_target", "cross_region_bytes_ratio", "final_loss_delta"}


def test_a_contender_without_progress_is_reported_failed() -> None:
    seed_only = [{"t_s": 0.0, "tokens": 0, "loss": 5.0}]
    assert e2e._failed({}, seed_only) is not None
    assert e2e._failed({"error": "TimeoutError: x"}, []) == "TimeoutError: x"
    two = seed_only + [{"t_s": 1.0, "tokens": 10, "loss": 4.0}]
    assert e2e._failed({"extra": {"rounds_committed": 0, "rounds_discarded": 3}}, two) == "no round committed (3 discarded)"
    assert e2e._failed({"extra": {"rounds_committed": 2}}, two) is None


def test_time_breakdown_means_over_peers() -> None:
    stats = {"a": {"wall_s": 10.0, "compute_s": 4.0, "sync_wait_s": 3.0, "checkpoint_s": 1.0, "round_s": 5.0},
             "b": {"wall_s": 12.0, "compute_s": 6.0, "sync_wait_s": 1.0, "checkpoint_s": 1.0, "round_s": 3.0}}
    out = e2e.time_breakdown(stats)
    assert out is not None
    assert out["wall_s"] == 11.0 and out["compute_s"] == 5.0 and out["sync_wait_s"] == 2.0
    assert out["other_s"] == pytest.approx(3.0) and out["cpu_s"] is None
    assert e2e.time_breakdown({}) is None


def test_the_tiny_llama_and_any_hf_config_are_models_of_the_benchmark(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``--preset tiny-llama`` and ``--hf-config PATH`` train a transformers model on the byte corpus, at the
    tiny GPT's tokens per sample; a missing config is refused at parse time."""
    from geotrain.config import job_from_dict
    from geotrain.models import build_stage

    for argv in (["--preset", "tiny-llama"], ["--hf-config", str(e2e.HF_PRESETS["tiny-llama"] / "config.json")]):
        args = e2e.parse(argv)
        job = e2e.job_dict(args, tmp_path, regions=3)
        assert job["model"]["vocab_size"] == 256 and job["model"]["seq_len"] == 32
        spec = job_from_dict(job)
        block_model = spec.model.block_model(0)
        assert type(block_model).__name__ == "HFModel"
        stage = build_stage(block_model, (0, block_model.num_blocks), 0)
        assert stage(torch.zeros(2, 32, dtype=torch.long)).shape == (2, 32, 256)
        # each pipeline takes 16 samples of 32 tokens per step
        assert job["stop"]["steps"] == args.budget_tokens // (job["pipeline"]["pipelines"] * 16 * 32)
    with pytest.raises(SystemExit):
        e2e.parse(["--hf-config", str(tmp_path / "nowhere")])
