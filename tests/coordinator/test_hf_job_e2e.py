"""Whole jobs of Hugging Face models: `geotrain dht` + `geotrain peer`s + the coordinator, then export and load.

The headline case: a tiny Llama from a local config, a byte-level BPE trained on the job's JSONL data, four peers
in two regions, `geotrain export`, and plain `transformers` loading the export: its loss on held-out text is far
below the untrained model's and its logits equal geotrain's own assembled global model.
"""

from __future__ import annotations

import importlib.util
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from geotrain.cli import main as geotrain_main
from geotrain.cli.run import run_coordinator
from geotrain.config import job_from_dict
from geotrain.local.procs import ChildGroup
from geotrain.local.swarm import LocalSwarm, start_local_swarm

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(420)]

transformers = pytest.importorskip("transformers")


def _make_corpus(path: Path, *, max_bytes: int) -> list[str]:
    spec = importlib.util.spec_from_file_location("make_corpus", Path(__file__).parents[2] / "examples/data/make_corpus.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.write_corpus(path, max_bytes=max_bytes)
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


def _job(*, model: dict[str, Any], data: dict[str, Any], steps: int, stages: int, min_peers: int) -> Any:
    return job_from_dict({
        "job": {"name": "hf", "seed": 3},
        "model": model,
        "data": data,
        "pipeline": {"stages": stages, "pipelines": "auto", "micro_batch_size": 4, "microbatches": 2},
        "optimizer": {"lr": 6e-3, "warmup_steps": 10, "schedule": "cosine"},
        "sync": {"every": 10, "codec": "int8"},
        "stop": {"steps": steps},
        "swarm": {"min_peers": min_peers, "wait_peers_s": 120, "hop_timeout_s": 30, "round_timeout_s": 30},
        "report": {"eval_batches": 2, "export": True},
    })


@torch.no_grad()
def _loss(model: Any, ids: torch.Tensor) -> float:
    logits = model(ids[:, :-1]).logits
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1)))


def test_llama_bpe_jsonl_job_exports_a_model_transformers_loads(children: ChildGroup, tmp_path: Path) -> None:
    docs = _make_corpus(tmp_path / "all.jsonl", max_bytes=700_000)
    cut = int(len(docs) * 0.8)
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[:cut]))
    held_out = "\n".join(docs[cut:])
    cfg = transformers.LlamaConfig(hidden_size=48, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128, vocab_size=1000,
                                   tie_word_embeddings=False)
    cfg.save_pretrained(tmp_path / "llama")
    job = _job(model={"hf_config": str(tmp_path / "llama"), "seq_len": 32},
               data={"source": "jsonl", "path": str(tmp_path / "corpus.jsonl"), "tokenizer": "bpe:512",
                     "max_bytes": 400_000},
               steps=200, stages=2, min_peers=4)
    swarm = start_local_swarm(children, regions=["us", "us", "eu", "eu"], job_id="hf-llama")
    run = tmp_path / "run"
    events: list[dict[str, Any]] = []
    report = run_coordinator(None, initial_peers=swarm.maddrs, job_id="hf-llama", report_dir=run,
                             emit=events.append, job=job)
    val = [v for v in report["validation"] if v["loss"] is not None]
    assert val[0]["source"] == "init" and val[-1]["source"] == "global", val
    assert val[-1]["loss"] < val[0]["loss"] - 1.0, val
    assert any(e["event"] == "export" for e in events), [e for e in events if e["event"] in ("error", "model")]

    out = tmp_path / "exported"
    assert geotrain_main(["export", str(run), str(out)]) == 0
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == len(tok) or model.config.vocab_size >= tok.vocab_size

    ids = torch.tensor(tok(held_out)["input_ids"][: 16 * 33]).view(16, 33)
    torch.manual_seed(0)
    untrained = transformers.AutoModelForCausalLM.from_config(model.config).eval()
    trained_loss, untrained_loss = _loss(model, ids), _loss(untrained, ids)
    assert math.isfinite(trained_loss)
    assert trained_loss < untrained_loss - 1.0, (trained_loss, untrained_loss)

    # the export is geotrain's own assembled global model, to 1e-5
    from geotrain.coordinator.artifacts import read_run
    from geotrain.models import build_stage

    rjob, params, _ = read_run(run)
    block_model = rjob.model.block_model(rjob.job.seed)
    whole = build_stage(block_model, (0, block_model.num_blocks), rjob.job.seed)
    with torch.no_grad():
        for name, p in whole.named_parameters():
            p.copy_(params[name])
        ours = whole.eval()(ids[:4, :-1])
        theirs = model(ids[:4, :-1]).logits
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def swarm2() -> Iterator[LocalSwarm]:
    """Two peers (``us``, ``eu``) that follow the newest job: one swarm for both families' jobs."""
    group = ChildGroup(preload=True)
    try:
        yield start_local_swarm(group, regions=["us", "eu"])
    finally:
        group.close(grace=2.0)  # as the `children` fixture (tests/conftest.py)


@pytest.mark.parametrize("family", ["qwen2", "mistral"])
def test_qwen2_and_mistral_jobs_continue_from_pretrained_weights(
    swarm2: LocalSwarm, tmp_path: Path, family: str
) -> None:
    common = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, vocab_size=256)
    if family == "qwen2":
        cfg = transformers.Qwen2Config(**common, tie_word_embeddings=True)
    else:
        cfg = transformers.MistralConfig(**common, tie_word_embeddings=False, sliding_window=None)
    torch.manual_seed(7)
    pretrained = transformers.AutoModelForCausalLM.from_config(cfg)
    pretrained.save_pretrained(tmp_path / "pretrained")  # continued pretraining starts from these weights
    job = _job(model={"hf_pretrained": str(tmp_path / "pretrained"), "seq_len": 32},
               data={"max_bytes": 300_000}, steps=20, stages=2, min_peers=2)
    report = run_coordinator(None, initial_peers=swarm2.maddrs, job_id=f"hf-{family}", report_dir=tmp_path / "run",
                             job=job)
    val = [v for v in report["validation"] if v["loss"] is not None]
    # the initial model is the pretrained one (not a seeded init), and training lowers its loss
    assert val[-1]["loss"] < val[0]["loss"] - 0.3, val
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "export")
    assert type(exported).__name__ == type(pretrained).__name__
