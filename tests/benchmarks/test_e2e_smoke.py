"""Smoke test of ``python -m benchmarks.e2e --smoke``: every contender trains, reports, and is compared.

Contenders other than DP train past the budget towards DP's loss (at most
``--cap`` x the budget); both the fixed-budget figures and the whole run are checked.

With root the regions are network namespaces and bytes come from the kernel's
counters; without root the benchmark runs on loopback (``--netns auto``) and
the namespace-only assertions are skipped.
"""

from __future__ import annotations

import json
import os

import pytest

from benchmarks import e2e

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]


def _lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_e2e_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    code = e2e.main(["--smoke"])
    lines = _lines(capsys.readouterr().out)
    assert code == 0, lines
    config = lines[0]
    assert config["event"] == "config"
    contenders = {ln["name"]: ln for ln in lines if ln["event"] == "contender"}
    assert set(contenders) == set(e2e.ALL)
    init = config["init_val_loss"]
    for name, ln in contenders.items():
        assert "error" not in ln, (name, ln.get("error"))
        assert ln["val_loss_final"] < init, (name, ln["val_loss_final"], init)  # every contender trained
        assert ln["wall_s"] > 0 and ln["checkpoints"] >= 1
        assert 0 < ln["compute_utilisation"] <= 1
        assert ln["cross_region_bytes"] is None or ln["cross_region_bytes"] > 0
        assert ln["usd"]["total"] > 0
        # the curve is the global model's validation loss over training wall time, starting at the seed
        assert ln["curve"][0] == [0.0, 0, init]
        assert all(a[0] <= b[0] for a, b in zip(ln["curve"], ln["curve"][1:], strict=False))
        # past the budget: the whole run is reported beside the fixed-budget figures
        ext = ln["extended"]
        assert ln["failed"] is False and ext["trained_s"] >= ln["wall_s"] - 1e-3
        assert ext["tokens"] >= ln["tokens"] and ext["val_loss_best"] <= ln["val_loss_final"]
        if name != "ddp":
            assert ln["goal_loss"] is not None and ext["stopped"] in ("target", "cap", "timeout")
            assert ext["tokens"] <= config["cap_tokens"] + 1
            assert ln["reached_target"] == (min(p[2] for p in ln["curve"]) <= ln["target_loss"])
    # geotrain's clock starts once its peers built their workers, as the others' start after their setup
    geo = contenders["geotrain"]
    assert geo["setup_s"] >= 0 and 0 < geo["compute_utilisation_in_plan"] <= 1
    ddp = contenders["ddp"]
    assert ddp["target_loss"] == ddp["val_loss_final"] and ddp["reached_target"]
    summary = lines[-1]
    assert summary["event"] == "summary" and summary["target_loss"] == ddp["val_loss_final"]
    diloco_best = min(p[2] for p in contenders["diloco"]["curve"])
    assert summary["vs_diloco"]["target_loss"] == diloco_best and summary["vs_diloco"]["target_from"] == "diloco best"
    for vs in ("vs_ddp", "vs_diloco"):
        assert {"speedup_to_target", "speedup_to_target_with_setup", "cross_region_bytes_ratio",
                "final_loss_delta"} <= set(summary[vs])
        fast, slow = summary[vs]["speedup_to_target"], summary[vs]["speedup_to_target_with_setup"]
        assert (fast is None) == (slow is None) and (fast is None or slow <= fast)
    assert set(summary["targets_met"]) == {"speedup_vs_ddp>=10", "speedup_vs_diloco>=1.5",
                                           "cross_region_bytes_vs_ddp>=1000x", "compute_utilisation>=0.95"}
    if config["network"] == "netns":
        for ln in contenders.values():
            assert ln["bytes_method"] == "kernel"
            # every region sent and received bytes during training (not every pair: an all-reduce may route
            # through one region, e.g. hivemind's load balancing can give a peer no part to reduce)
            pairs = ln["bytes_by_region_pair"]
            for region in set(config["regions"]):
                assert sum(v for k, v in pairs.items() if k.startswith(f"{region}->")) > 0, (ln["name"], pairs)
                assert sum(v for k, v in pairs.items() if k.endswith(f"->{region}")) > 0, (ln["name"], pairs)
        # DP sends every gradient every step across regions; geotrain only its int8 pseudo-gradients per round
        assert summary["vs_ddp"]["cross_region_bytes_ratio"] > 2


@pytest.mark.skipif(os.geteuid() == 0, reason="checks the no-root fallback")
def test_e2e_refuses_netns_without_root() -> None:
    with pytest.raises(Exception, match="root"):
        e2e.main(["--smoke", "--netns", "on", "--contenders", "ddp"])


def test_time_to_target_interpolates() -> None:
    from benchmarks.contenders.results import time_to_target

    curve = [{"t_s": 0.0, "loss": 5.0}, {"t_s": 10.0, "loss": 3.0}, {"t_s": 20.0, "loss": 2.0}]
    assert time_to_target(curve, 2.5) == pytest.approx(15.0)
    assert time_to_target(curve, 3.0) == pytest.approx(10.0)
    assert time_to_target(curve, 1.0) is None
    assert time_to_target(curve, None) is None


@pytest.mark.timeout(180)
def test_e2e_smoke_regime(capsys: pytest.CaptureFixture[str]) -> None:
    """``--regime``: the mapping is the first line, its links are what the formula gives for the measured step."""
    from geotrain.emulate.regime import BUILTIN, map_regime

    code = e2e.main(["--smoke", "--regime", "1b-h100-1gbit", "--contenders", "ddp"])
    lines = _lines(capsys.readouterr().out)
    assert code == 0, lines
    mapping, config = lines[0], lines[1]
    assert mapping["event"] == "regime" and config["event"] == "config" and config["regime"] == "1b-h100-1gbit"
    assert mapping["regime"] == BUILTIN["1b-h100-1gbit"].to_dict()
    assert mapping["dp_comm_fraction"] > 0.9  # the users' regime: a DP step mostly communicates
    again = map_regime(BUILTIN["1b-h100-1gbit"], peers=config["peers"], bench_params=mapping["bench_params"],
                       bench_dp_bytes_per_param=4, step_s=mapping["measured_step_s"],
                       peers_per_region=mapping["peers_per_region"]).describe()
    # the JSON lines carry 4 decimals: a step of ~0.05 s is known to 0.1%
    assert mapping["wan_mbit"] == pytest.approx(again["wan_mbit"], rel=5e-3)
    assert mapping["wan_rtt_ms"] == pytest.approx(again["wan_rtt_ms"], rel=5e-3)
    assert len(mapping["calibration"]["per_worker_step_s"]) == config["peers"]
    ddp = next(ln for ln in lines if ln.get("event") == "contender")
    assert "error" not in ddp and ddp["val_loss_final"] < config["init_val_loss"]


def test_snapshots_keep_the_earliest_per_token_count() -> None:
    """Every hivemind peer snapshots the epochs it reaches; a lagging rank 0 must not lose the budget's model."""
    from benchmarks.contenders.workers import Snapshots

    s = Snapshots()
    assert s.last() is None
    assert s.add({"t_s": 2.0, "tokens": 100, "path": "r1-a"}, 1)
    assert not s.add({"t_s": 3.0, "tokens": 100, "path": "r2-a"}, 2)  # later copy of the same epoch
    assert s.add({"t_s": 5.0, "tokens": 300, "path": "r0-c"}, 0)  # rank 0 caught up past epoch 2
    assert s.add({"t_s": 4.0, "tokens": 200, "path": "r1-b"}, 1)
    assert not s.add({"t_s": 1.5, "tokens": 100, "path": "r0-a"}, 0)  # an earlier copy replaces it
    assert [(c["tokens"], c["path"], c["rank"]) for c in s.ordered()] == [(100, "r0-a", 0), (200, "r1-b", 1),
                                                                          (300, "r0-c", 0)]
    assert s.last()["tokens"] == 300
