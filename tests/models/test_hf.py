"""Hugging Face causal LMs as block models: cuts exact against the unsplit ``transformers`` model."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from geotrain.data import DataConfig, TokenDataset, build_dataset
from geotrain.errors import ConfigError
from geotrain.models import HFModel, StageModule, build_stage, cross_entropy_loss, weights_digest
from geotrain.models.profile import layer_profile
from geotrain.pipeline import LocalPipeline, StageConfig
from tests.models.hf_util import VOCAB, reference_model, tiny_config, write_config

SEED = 7
CUTS = {2: [(0, 2), (2, 5)], 3: [(0, 1), (1, 3), (3, 5)]}  # 5 blocks: embeddings, 3 layers, norm + head


def _batch(seed: int = 0, *, batch: int = 2, length: int = 17, vocab: int = VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, length + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def _chain(stages: list[StageModule], x: torch.Tensor) -> torch.Tensor:
    for st in stages:
        x = st(x)
    return x


def _summed_grads(model: HFModel, stages: list[StageModule]) -> dict[str, torch.Tensor]:
    """Every parameter's gradient by geotrain name; the copies of a tied weight summed, under each copy's name."""
    grads = {n: p.grad for st in stages for n, p in st.named_parameters()}
    for group in model.tied_groups:
        names = [f"blocks.{b}.{n}" for b, n in group.members]
        present = [n for n in names if n in grads]
        total = sum(grads[n] for n in present)
        for n in present:
            grads[n] = total
    return grads


@pytest.mark.parametrize("num_stages", [2, 3])
@pytest.mark.parametrize(
    ("family", "attn"),
    [("llama", "sdpa"), ("llama", "eager"), ("gpt2", "sdpa"), ("gpt2", "eager"), ("qwen2", "sdpa"), ("mistral", "sdpa")],
)
def test_stage_cuts_equal_transformers(tmp_path: Path, family: str, attn: str, num_stages: int) -> None:
    path = write_config(tmp_path / family, family)
    model = HFModel.from_config(path, seed=SEED, attn_implementation=attn)
    ref = reference_model(path, seed=SEED, attn=attn)
    assert bool(model.tied_groups) == (family in ("gpt2", "qwen2"))
    stages = [build_stage(model, r, SEED) for r in CUTS[num_stages]]
    # the same seed built the same weights, and the names map onto the model's own
    ref_params = dict(ref.named_parameters())
    ours = {n: p for st in stages for n, p in st.named_parameters()}
    mapped = model.hf_state_dict(ours)
    assert set(mapped) == set(ref_params)
    for name, p in mapped.items():
        assert torch.equal(p, ref_params[name]), name

    ids, targets = _batch()
    ref_loss = cross_entropy_loss(ref(input_ids=ids).logits, targets)
    ref_loss.backward()
    loss = stages[-1].loss(_chain(stages, ids), targets)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(float(ref_loss.detach()), abs=1e-5)
    grads = _summed_grads(model, stages)
    assert set(grads) == set(ours)
    for name, g in grads.items():
        ref_grad = ref_params[model.hf_name(name) if not name.endswith("head.weight") or not model.tied_groups
                              else model.hf_name("blocks.0.embed.weight")].grad
        torch.testing.assert_close(g, ref_grad, rtol=0, atol=1e-5, msg=name)


def test_names_map_both_ways(tmp_path: Path) -> None:
    for family in ("llama", "gpt2"):
        model = HFModel.from_config(write_config(tmp_path / family, family), seed=SEED)
        full = build_stage(model, (0, model.num_blocks), SEED)
        for name, _ in full.named_parameters():
            assert model.geotrain_name(model.hf_name(name)) == name
        assert model.hf_name("blocks.1.layer.mlp.c_fc.weight" if family == "gpt2" else "blocks.1.layer.mlp.up_proj.weight") \
            == ("transformer.h.0.mlp.c_fc.weight" if family == "gpt2" else "model.layers.0.mlp.up_proj.weight")
        assert model.geotrain_name("lm_head.weight") == f"blocks.{model.num_blocks - 1}.head.weight"
        with pytest.raises(ConfigError, match="not a parameter name"):
            model.hf_name("blocks.9.layer.x")


def test_tied_head_built_alone_holds_an_identical_copy(tmp_path: Path) -> None:
    model = HFModel.from_config(write_config(tmp_path / "q", "qwen2"), seed=SEED)
    first, last = build_stage(model, (0, 2), SEED), build_stage(model, (2, 5), SEED)
    embed, head = first.blocks["0"].embed.weight, last.blocks["4"].head.weight
    assert torch.equal(embed, head) and embed.data_ptr() != head.data_ptr()
    assert [t.name for t in first.tied_parameters()] == ["blocks.0.embed.weight"]
    assert [t.name for t in last.tied_parameters()] == ["blocks.4.head.weight"]
    whole = build_stage(model, (0, 5), SEED)  # both members in one stage: one Parameter
    assert whole.blocks["0"].embed.weight is whole.blocks["4"].head.weight and whole.tied_parameters() == []


def test_builds_are_deterministic(tmp_path: Path) -> None:
    path = write_config(tmp_path / "llama", "llama")
    a, b = HFModel.from_config(path, seed=SEED), HFModel.from_config(path, seed=SEED)
    c = HFModel.from_config(path, seed=SEED + 1)
    rng_before = torch.random.get_rng_state()
    HFModel.from_config(path, seed=SEED)
    assert torch.equal(rng_before, torch.random.get_rng_state())  # the global RNG is left as it was
    sa, sb = (dict(build_stage(m, (0, m.num_blocks), SEED).named_parameters()) for m in (a, b))
    sc = dict(build_stage(c, (0, c.num_blocks), SEED + 1).named_parameters())
    assert all(torch.equal(sa[n], sb[n]) for n in sa)
    assert not all(torch.equal(sa[n], sc[n]) for n in sa)
    with pytest.raises(ConfigError, match="built with seed 7"):
        a.build_block(1, SEED + 1)


def test_activation_checkpointing_gives_the_same_loss_and_gradients(tmp_path: Path) -> None:
    path = write_config(tmp_path / "llama", "llama")
    results, saved = [], []
    for ckpt in (False, True):
        model = HFModel.from_config(path, seed=SEED, activation_checkpointing=ckpt)
        stages = [build_stage(model, r, SEED) for r in CUTS[2]]
        ids, targets = _batch()
        count = [0]

        def pack(t: torch.Tensor, count: list[int] = count) -> torch.Tensor:
            count[0] += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = stages[-1].loss(_chain(stages, ids), targets)
        loss.backward()
        saved.append(count[0])
        results.append((float(loss.detach()), {n: p.grad for st in stages for n, p in st.named_parameters()}))
    assert saved[1] < saved[0] / 2, saved  # the decoder layers kept only their inputs for the backward
    (loss0, g0), (loss1, g1) = results
    assert loss0 == pytest.approx(loss1, abs=1e-6)
    for name in g0:
        torch.testing.assert_close(g0[name], g1[name], rtol=0, atol=1e-6, msg=name)


def test_save_pretrained_loads_in_transformers_and_back(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    for family in ("llama", "gpt2"):
        model = HFModel.from_config(write_config(tmp_path / family, family), seed=SEED)
        stages = [build_stage(model, r, SEED) for r in CUTS[3]]
        with torch.no_grad():  # move the weights off their init so the round trip carries trained values
            for st in stages:
                for p in st.parameters():
                    p.add_(0.01)
        params = {n: p for st in stages for n, p in st.named_parameters()}
        out = model.save_pretrained(params, tmp_path / f"out-{family}")
        assert {"config.json", "model.safetensors", "generation_config.json"} <= {f.name for f in out.iterdir()}
        saved = load_file(str(out / "model.safetensors"))
        assert ("lm_head.weight" in saved) == (family == "llama")  # a tied weight is saved once
        ids, _ = _batch(3)
        with torch.no_grad():
            logits = _chain(stages, ids)
            hf = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
            torch.testing.assert_close(hf(input_ids=ids).logits, logits, rtol=0, atol=1e-5)
            loaded = HFModel.from_pretrained(out)
            assert loaded.seed is None and loaded.num_blocks == model.num_blocks
            again = [build_stage(loaded, r, 123) for r in CUTS[2]]
            torch.testing.assert_close(_chain(again, ids), logits, rtol=0, atol=1e-5)
        with pytest.raises(ConfigError, match="weights missing"):
            model.save_pretrained({n: p for n, p in params.items() if not n.startswith("blocks.2.")}, tmp_path / "bad")


def test_weights_digest_follows_the_bytes(tmp_path: Path) -> None:
    model = HFModel.from_config(write_config(tmp_path / "llama", "llama"), seed=SEED)
    params = dict(build_stage(model, (0, model.num_blocks), SEED).named_parameters())
    a, b = model.save_pretrained(params, tmp_path / "a"), model.save_pretrained(params, tmp_path / "b")
    assert weights_digest(a) == weights_digest(b)
    tensors = load_file(str(b / "model.safetensors"))
    tensors["model.norm.weight"] = tensors["model.norm.weight"].clone()
    tensors["model.norm.weight"][0] += 1e-3
    save_file(tensors, str(b / "model.safetensors"), metadata={"format": "pt"})
    assert weights_digest(a) != weights_digest(b)
    with pytest.raises(ConfigError, match="no \\*.safetensors"):
        weights_digest(tmp_path)


def test_from_pretrained_refuses_missing_weights_and_pickles(tmp_path: Path) -> None:
    model = HFModel.from_config(write_config(tmp_path / "llama", "llama"), seed=SEED)
    out = model.save_pretrained(dict(build_stage(model, (0, 5), SEED).named_parameters()), tmp_path / "out")
    tensors = load_file(str(out / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ConfigError, match="lacks weights"):
        HFModel.from_pretrained(out)
    (out / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match="no \\*.safetensors"):
        HFModel.from_pretrained(out)


def test_vocab_and_sequence_length(tmp_path: Path) -> None:
    path = write_config(tmp_path / "gpt2", "gpt2")
    model = HFModel.from_config(path / "config.json", seed=SEED, vocab_size=256, seq_len=32)
    assert (model.vocab_size, model.seq_len, model.max_positions, model.num_blocks) == (256, 32, 64, 5)
    assert model.hf_config.vocab_size == 256
    assert build_stage(model, (4, 5), SEED).blocks["4"].head.weight.shape == (256, 32)
    assert HFModel.from_config(path, seed=SEED).seq_len == 64  # default: the config's maximum
    with pytest.raises(ConfigError, match=r"seq_len 65 is longer .*\(64 positions\)"):
        HFModel.from_config(path, seed=SEED, seq_len=65)
    with pytest.raises(ConfigError, match="does not exist"):
        HFModel.from_config(tmp_path / "nowhere", seed=SEED)
    padded = write_config(tmp_path / "padded", "llama", pad_token_id=100)
    assert HFModel.from_config(padded, seed=SEED).vocab_size == VOCAB
    with pytest.raises(ConfigError, match="pad_token_id 100 is outside the vocabulary of 64"):
        HFModel.from_config(padded, seed=SEED, vocab_size=64)


def test_unsupported_architectures_are_refused_by_name(tmp_path: Path) -> None:
    import transformers

    opt = transformers.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                                 vocab_size=VOCAB, max_position_embeddings=64, word_embed_proj_dim=32)
    opt.architectures = ["OPTForCausalLM"]
    opt.save_pretrained(str(tmp_path / "opt"))
    with pytest.raises(ConfigError, match="OPTForCausalLM .*'opt'.*ModuleList of decoder layers"):
        HFModel.from_config(tmp_path / "opt", seed=SEED)
    # a head whose output the model caps after the head: the blocks would train something else
    gemma2 = transformers.Gemma2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, head_dim=8, vocab_size=VOCAB, max_position_embeddings=64)
    gemma2.save_pretrained(str(tmp_path / "gemma2"))
    with pytest.raises(ConfigError, match="gemma2.*final_logit_softcapping"):
        HFModel.from_config(tmp_path / "gemma2", seed=SEED)


def test_meta_profile_of_a_1b_config_allocates_nothing(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "llama-1b", "llama", vocab_size=128256, layers=16, hidden_size=2048, intermediate_size=8192,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096, tie_word_embeddings=True,
    )
    model = HFModel.from_config(path, seed=SEED, device="meta", seq_len=256)
    assert [g.name for g in model.tied_groups] == ["embedding"]
    block = model.build_block(1, SEED)
    assert all(p.is_meta for p in block.parameters())
    profile = layer_profile(model, sample_input=torch.zeros(1, 256, dtype=torch.long))
    assert len(profile) == 18
    embed_bytes = 128256 * 2048 * 4
    assert profile[0].param_bytes == embed_bytes and profile[-1].param_bytes == embed_bytes + 2048 * 4
    layer_params = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048  # q, o + k, v (GQA) + MLP + norms
    assert profile[1].param_bytes == layer_params * 4
    # matmuls: 6 FLOPs per weight per token, plus attention's scores and values
    assert 6 * (layer_params - 2 * 2048) <= profile[1].flops_per_token < 1.2 * 6 * layer_params
    assert profile[-1].flops_per_token == pytest.approx(6 * 128256 * 2048, rel=0.01)
    assert profile[1].activation_bytes_per_token == 2048 * 4 and profile[-1].activation_bytes_per_token == 0
    assert all(p.flops_per_token == profile[1].flops_per_token for p in profile[1:-1])


# -- over the pipeline runtime, one thread per stage ----------------------------------------------------------
BATCH, MBS, LR = 8, 4, 1e-3


@pytest.fixture(scope="module")
def dataset() -> TokenDataset:
    return build_dataset(DataConfig(max_bytes=64 << 10))


def _reference_step(model: HFModel, data: Callable[[int], torch.Tensor]) -> tuple[float, dict[str, torch.Tensor]]:
    """One inner step of the whole model in this process: (loss, updated weights by geotrain name)."""
    full = build_stage(model, (0, model.num_blocks), SEED)
    opt = torch.optim.AdamW(full.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    total = 0.0
    for mb in data(0).chunk(MBS):
        loss = full.loss(full(mb[:, :-1]), mb[:, 1:])
        total += float(loss.detach()) / MBS
        (loss / MBS).backward()
    opt.step()
    return total, {n: p.detach() for n, p in full.named_parameters()}


@pytest.mark.parametrize("layers", [CUTS[2], CUTS[3]], ids=["2-stage", "3-stage"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_local_pipeline_step_equals_single_process(tmp_path: Path, dataset, family: str, layers) -> None:
    model = HFModel.from_config(write_config(tmp_path / family, family, vocab_size=256), seed=SEED, seq_len=32)
    data = lambda step: dataset.get_batch(step, batch_size=BATCH, seq_len=model.seq_len, seed=SEED)  # noqa: E731
    ref_loss, ref_weights = _reference_step(model, data)
    cfg = StageConfig(job="hf-job", stage=0, num_stages=len(layers), microbatches=MBS, lr=LR, hop_timeout_s=30.0)
    with LocalPipeline(model, layers, cfg, seed=SEED, data=data) as pp:
        metrics = pp.step(0)
        weights = {n: p.detach() for st in pp.stages for n, p in st.named_parameters()}
    assert metrics[-1].loss == pytest.approx(ref_loss, abs=1e-5)
    tied_head = f"blocks.{model.num_blocks - 1}.head.weight"
    assert set(weights) - set(ref_weights) == ({tied_head} if model.tied_groups else set())
    for name, w in weights.items():
        ref = ref_weights["blocks.0.embed.weight" if name == tied_head and model.tied_groups else name]
        torch.testing.assert_close(w, ref, rtol=0, atol=1e-5, msg=name)


def test_sliding_window_is_applied(tmp_path: Path) -> None:
    path = write_config(tmp_path / "m", "mistral")
    assert json.loads((path / "config.json").read_text())["model_type"] == "mistral"
    assert tiny_config("mistral").sliding_window == 8
    model = HFModel.from_config(path, seed=SEED)
    # the sliding window is narrower than the sequence: positions past it must not see the first token
    full = build_stage(model, (0, model.num_blocks), SEED).eval()
    ids, _ = _batch(length=20)
    changed = ids.clone()
    changed[:, 0] = (changed[:, 0] + 1) % VOCAB
    with torch.no_grad():
        a, b = full(ids), full(changed)
    assert not torch.allclose(a[:, 1], b[:, 1])
    # three layers of an 8-wide window reach back at most 3 * 7 positions: none past 21 exist, so use the first layer
    one = HFModel.from_config(write_config(tmp_path / "m1", "mistral", layers=1), seed=SEED)
    first = build_stage(one, (0, one.num_blocks), SEED).eval()
    with torch.no_grad():
        assert torch.equal(first(ids)[:, 8:], first(changed)[:, 8:])
