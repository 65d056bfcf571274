from __future__ import annotations

import textwrap

import pytest
import torch

from geotrain.errors import ConfigError
from geotrain.models import (
    PRESETS,
    BlockList,
    GPTConfig,
    TiedGroup,
    build_stage,
    even_split,
    load_block_model,
    resolve_model,
)

TINY = GPTConfig.preset("tiny")


def test_config_validation_says_the_fix() -> None:
    with pytest.raises(ConfigError, match="divisible by model.n_head"):
        GPTConfig(d_model=30, n_head=4)
    with pytest.raises(ConfigError, match="n_layer must be a positive integer"):
        GPTConfig(n_layer=0)
    with pytest.raises(ConfigError, match="unknown model preset"):
        GPTConfig.preset("huge")


@pytest.mark.parametrize("tie", [True, False])
def test_parameter_count_formula_matches_the_module(tie: bool) -> None:
    cfg = GPTConfig.preset("tiny", tie_embeddings=tie)
    full = build_stage(cfg, (0, cfg.num_blocks), seed=0)
    assert sum(p.numel() for p in full.parameters()) == cfg.num_parameters()
    assert 50_000 < PRESETS["tiny"].num_parameters() < 150_000
    assert PRESETS["1b"].num_parameters() > 1_000_000_000


def test_init_is_deterministic_per_seed() -> None:
    a = build_stage(TINY, (1, 3), seed=7)
    b = build_stage(TINY, (1, 3), seed=7)
    c = build_stage(TINY, (1, 3), seed=8)
    for (na, pa), (nb, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters(), strict=True):
        assert na == nb
        assert torch.equal(pa, pb)
        if pa.dim() == 2:  # matrices are random; norms/biases are constant
            assert not torch.equal(pa, pc)
    # blocks draw from independent streams: layer 1 and layer 2 differ
    assert not torch.equal(a.blocks["1"].qkv.weight, a.blocks["2"].qkv.weight)


def test_any_cut_equals_the_whole_model() -> None:
    full = build_stage(TINY, (0, TINY.num_blocks), seed=3)
    stages = [build_stage(TINY, r, seed=3) for r in even_split(TINY.num_blocks, 3)]
    assert [s.is_first for s in stages] == [True, False, False]
    assert [s.is_last for s in stages] == [False, False, True]
    x = torch.randint(0, 256, (2, TINY.seq_len))
    y = x
    for s in stages:
        y = s(y)
    assert y.shape == (2, TINY.seq_len, TINY.vocab_size)
    torch.testing.assert_close(y, full(x), rtol=0, atol=0)
    whole = dict(full.named_parameters())
    for s in stages:
        for name, p in s.named_parameters():
            key = "blocks.0.wte.weight" if name.endswith("lm_head.weight") else name
            assert torch.equal(p, whole[key]), name


def test_tied_embedding_within_one_stage_is_one_parameter() -> None:
    full = build_stage(TINY, (0, TINY.num_blocks), seed=0)
    assert full.blocks["0"].wte.weight is full.blocks[str(TINY.num_blocks - 1)].lm_head.weight
    assert full.tied_parameters() == []
    untied = build_stage(GPTConfig.preset("tiny", tie_embeddings=False), (0, TINY.num_blocks), seed=0)
    assert not torch.equal(untied.blocks["0"].wte.weight, untied.blocks["5"].lm_head.weight)


def test_tied_embedding_across_stages_sums_gradients_to_the_whole_models() -> None:
    full = build_stage(TINY, (0, TINY.num_blocks), seed=1)
    first, last = build_stage(TINY, (0, 3), seed=1), build_stage(TINY, (3, TINY.num_blocks), seed=1)
    (t_first,), (t_last,) = first.tied_parameters(), last.tied_parameters()
    assert t_first.group == t_last.group == "embedding"
    assert t_first.other_blocks == (TINY.num_blocks - 1,) and t_last.other_blocks == (0,)
    assert torch.equal(t_first.param, t_last.param) and t_first.param is not t_last.param

    batch = torch.randint(0, 256, (2, TINY.seq_len + 1))
    x, y = batch[:, :-1], batch[:, 1:]
    full.loss(full(x), y).backward()
    h = first(x)  # (B, T, C)
    h_in = h.detach().requires_grad_(True)
    last.loss(last(h_in), y).backward()
    h.backward(h_in.grad)
    summed = t_first.param.grad + t_last.param.grad
    torch.testing.assert_close(summed, full.blocks["0"].wte.weight.grad, rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match="only defined on the last stage"):
        first.loss(h, y)


def test_bad_layer_ranges_and_splits() -> None:
    for bad in [(0, 0), (-1, 2), (2, 99), (3, 2)]:
        with pytest.raises(ConfigError, match="0 <= start < end"):
            build_stage(TINY, bad, seed=0)
    assert even_split(6, 4) == [(0, 2), (2, 4), (4, 5), (5, 6)]
    with pytest.raises(ConfigError):
        even_split(3, 4)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "geo_user_model.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn
            from geotrain.models import BlockList, TiedGroup

            def mlp(width=16):
                return nn.Sequential(nn.Embedding(50, width), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 50))

            def tied(seed=0):
                emb, head = nn.Embedding(50, 16), nn.Linear(16, 50, bias=False)
                head.weight = emb.weight
                return BlockList(blocks=[emb, nn.Linear(16, 16), head], seed=seed,
                                 tied=(TiedGroup(name="emb", members=((0, "weight"), (2, "weight"))),))

            def wrong():
                return 42
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "geo_user_model"


def test_user_model_from_module_function(user_module: str) -> None:
    state = torch.random.get_rng_state()
    a = load_block_model(f"{user_module}:mlp", seed=5, kwargs={"width": 8})
    b = load_block_model(f"{user_module}:mlp", seed=5, kwargs={"width": 8})
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left alone
    assert isinstance(a, BlockList) and a.num_blocks == 4
    s_a, s_b = build_stage(a, (1, 4), seed=5), build_stage(b, (1, 4), seed=5)
    for pa, pb in zip(s_a.parameters(), s_b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    head = build_stage(a, (0, 1), seed=5)
    x = torch.randint(0, 50, (2, 7))
    assert s_a(head(x)).shape == (2, 7, 50)
    with pytest.raises(ConfigError, match="load it again with seed=6"):
        build_stage(a, (0, 1), seed=6)


def test_user_model_tied_across_stages_gets_separate_copies(user_module: str) -> None:
    model = load_block_model(f"{user_module}:tied", seed=0, kwargs={"seed": 0})
    first, last = build_stage(model, (0, 2), seed=0), build_stage(model, (2, 3), seed=0)
    (tf,), (tl,) = first.tied_parameters(), last.tied_parameters()
    assert tf.param is not tl.param and torch.equal(tf.param, tl.param)
    whole = build_stage(model, (0, 3), seed=0)
    assert whole.blocks["0"].weight is whole.blocks["2"].weight and whole.tied_parameters() == []


def test_user_model_errors(user_module: str) -> None:
    with pytest.raises(ConfigError, match="package.module:function"):
        load_block_model("no colon", seed=0)
    with pytest.raises(ConfigError, match="cannot import"):
        load_block_model("geo_missing_mod:fn", seed=0)
    with pytest.raises(ConfigError, match="no callable"):
        load_block_model(f"{user_module}:nothing", seed=0)
    with pytest.raises(ConfigError, match="returned int"):
        load_block_model(f"{user_module}:wrong", seed=0)
    with pytest.raises(ConfigError, match="at least two members"):
        TiedGroup(name="x", members=((0, "w"),))


def test_resolve_model() -> None:
    assert resolve_model("tiny").num_blocks == TINY.num_blocks
    assert resolve_model(TINY).num_blocks == TINY.num_blocks
