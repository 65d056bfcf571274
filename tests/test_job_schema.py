"""The job schema's newer keys: real models and data, LR schedules, stop conditions, every error at once."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from geotrain.cli import main
from geotrain.config import DEFAULT_STEPS, job_from_dict, load_job
from geotrain.data import DataConfig, build_dataset
from geotrain.errors import ConfigError
from geotrain.models import GPTConfig, GPTModel
from geotrain.peers.localise import local_path, localise_job
from geotrain.pipeline import LocalPipeline, StageConfig
from geotrain.pipeline.lr import LRSchedule


def test_every_problem_of_a_file_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('[sync]\nevry = 3\nevery = "ten"\n[optimizer]\nlr = -1\n[pipline]\nx = 1\n'
                    '[model]\nhf_config = "cfg"\nn_layer = 3\n')
    with pytest.raises(ConfigError) as info:
        load_job(path)
    errors = info.value.errors
    assert len(errors) == 6, errors
    text = str(info.value)
    for piece in ("unknown key sync.evry", "sync.every must be an integer", "optimizer.lr must be > 0",
                  "unknown section [pipline]", "model.n_layer shapes the reference GPT only",
                  "model.seq_len (the training context, in tokens) is required"):
        assert piece in text
    assert all(str(path) in e for e in errors)


def test_a_stop_condition_applies_only_when_set() -> None:
    assert job_from_dict({}).stop.steps == DEFAULT_STEPS  # nothing set: the default step count
    only_tokens = job_from_dict({"stop": {"tokens": 10_000}})
    assert only_tokens.stop.steps is None and only_tokens.stop.tokens == 10_000
    with pytest.raises(ConfigError, match="stop.wall_s must be > 0"):
        job_from_dict({"stop": {"wall_s": 0}})


def test_model_kinds_exclude_each_other_and_decay_needs_a_step_count() -> None:
    with pytest.raises(ConfigError, match="give one of loader, hf_config, hf_pretrained"):
        job_from_dict({"model": {"hf_config": "a", "hf_pretrained": "b", "seq_len": 8}})
    with pytest.raises(ConfigError, match="decays over optimizer.decay_steps"):
        job_from_dict({"optimizer": {"schedule": "cosine"}, "stop": {"tokens": 1000}})
    ok = job_from_dict({"optimizer": {"schedule": "linear", "decay_steps": 50}, "stop": {"tokens": 1000}})
    assert ok.decay_steps == 50


def test_relative_paths_are_relative_to_the_job_file(tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    path = tmp_path / "jobs" / "j.toml"
    path.write_text('[model]\nhf_config = "../models/x"\nseq_len = 16\n'
                    '[data]\nsource = "text"\npath = "../data/a.txt"\ntokenizer = "bpe:300"\n')
    job = load_job(path)
    assert job.model.hf_config == str((tmp_path / "models" / "x").resolve())
    assert job.data.path == str((tmp_path / "data" / "a.txt").resolve())
    assert job.data.tokenizer == "bpe:300"  # a spec, not a path


def test_learning_rate_schedules() -> None:
    const = LRSchedule(lr=1.0, warmup_steps=4)
    assert [const.at(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cos = LRSchedule(lr=1.0, warmup_steps=0, kind="cosine", decay_steps=10, min_lr_ratio=0.1)
    assert cos.at(0) == pytest.approx(1.0)
    assert cos.at(5) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert cos.at(10) == pytest.approx(0.1) and cos.at(99) == pytest.approx(0.1)
    lin = LRSchedule(lr=2.0, warmup_steps=2, kind="linear", decay_steps=12, min_lr_ratio=0.0)
    assert lin.at(1) == pytest.approx(2.0) and lin.at(7) == pytest.approx(1.0) and lin.at(12) == 0.0
    with pytest.raises(ConfigError):
        LRSchedule(lr=1.0, kind="cosine")


def test_the_runtime_sets_each_steps_rate_and_bf16_keeps_fp32_weights() -> None:
    cfg = GPTConfig.preset("tiny")
    ds = build_dataset(DataConfig(max_bytes=256 << 10))
    data = lambda step: ds.get_batch(step, batch_size=4, seq_len=cfg.seq_len, seed=1)  # noqa: E731
    sched = LRSchedule(lr=1e-3, warmup_steps=3)
    scfg = StageConfig(job="lr", stage=0, num_stages=2, microbatches=2, lr=1e-3, lr_schedule=sched,
                       compute_dtype="bf16")
    with LocalPipeline(GPTModel(cfg), [(0, 3), (3, 6)], scfg, seed=1, data=data) as pp:
        for step in range(3):
            losses = pp.step(step)
            assert math.isfinite(losses[-1].loss)
            for rt in pp.runtimes:
                assert rt.optimizer.param_groups[0]["lr"] == pytest.approx(sched.at(step))
        assert all(p.dtype == torch.float32 for st in pp.stages for p in st.parameters())


def test_a_peer_maps_the_jobs_paths_onto_its_own_copies(tmp_path: Path) -> None:
    assert local_path("corpus.jsonl", tmp_path) == str(tmp_path / "corpus.jsonl")
    assert local_path("/nowhere/on/this/box/corpus.jsonl", tmp_path) == str(tmp_path / "corpus.jsonl")
    assert local_path(str(tmp_path), "/elsewhere") == str(tmp_path)  # exists here: kept
    job = job_from_dict({"data": {"source": "text", "path": "/coordinator/data/a.txt"},
                         "model": {"hf_pretrained": "/coordinator/ckpt", "seq_len": 8}})
    mine = localise_job(job, data_dir=tmp_path / "d", model_dir=tmp_path / "m")
    assert mine.data.path == str(tmp_path / "d" / "a.txt")
    assert mine.model.hf_pretrained == str(tmp_path / "m" / "ckpt")
    assert localise_job(job) is job


def test_check_lists_every_problem_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "job.toml"
    path.write_text('[data]\nsource = "jsonl"\npath = "missing.jsonl"\n[model]\nloader = "no_such_pkg_xyz:build"\n')
    assert main(["check", str(path), "--json"]) == 2
    out = capsys.readouterr().out
    assert "no_such_pkg_xyz" in out and "missing.jsonl" in out


def test_check_of_the_tiny_example_passes(capsys: pytest.CaptureFixture[str]) -> None:
    example = Path(__file__).resolve().parents[1] / "examples" / "jobs" / "tiny.toml"
    assert main(["check", str(example), "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["model"]["blocks"] == 6 and out["model"]["vocab_size"] == 256
    assert out["data"]["train_tokens"] > 0


def test_a_pretrained_job_pins_its_weights_and_a_peer_with_other_weights_is_refused(tmp_path: Path) -> None:
    import transformers

    from geotrain.coordinator.prepare import prepare_job

    cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, max_position_embeddings=32, vocab_size=256)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "w")
    job = job_from_dict({"model": {"hf_pretrained": str(tmp_path / "w"), "seq_len": 16},
                         "data": {"max_bytes": 200_000}, "pipeline": {"micro_batch_size": 2, "microbatches": 1}})
    resolved = prepare_job(job).job
    assert resolved.model.weights_digest and resolved.model.vocab_size == 256
    assert '"model_type": "llama"' in (resolved.model.hf_config_json or "")
    assert resolved.model.block_model(0).num_blocks == 3
    torch.manual_seed(1)  # another peer's copy holds other weights
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "other")
    import dataclasses

    theirs = dataclasses.replace(resolved, model=dataclasses.replace(resolved.model, hf_pretrained=str(tmp_path / "other")))
    with pytest.raises(ConfigError, match="was launched from weights"):
        theirs.model.block_model(0)


def test_the_llama_example_checks_out_with_its_corpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util
    import json

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("make_corpus", root / "examples" / "data" / "make_corpus.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.write_corpus(tmp_path / "corpus.jsonl", max_bytes=300_000)
    job = root / "examples" / "jobs" / "llama_bpe.toml"
    assert main(["check", str(job), "--data-dir", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"]["model_type"] == "llama" and out["model"]["blocks"] == 6
    assert 256 < out["model"]["vocab_size"] <= 2048 and out["data"]["documents"] > 10


def test_egress_is_priced_per_region() -> None:
    import argparse

    from geotrain.cli.run import parse_egress

    assert parse_egress("0.05") == {"*": 0.05}
    assert parse_egress("us-east=0.02,ap-south=0.08,*=0.05") == {"us-east": 0.02, "ap-south": 0.08, "*": 0.05}
    for bad in ("cheap", "us-east=", "=0.1", "-1", "nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_egress(bad)
