from __future__ import annotations

import pytest
import torch
from torch import nn

from geotrain.errors import ConfigError
from geotrain.models import BlockList, GPTConfig
from geotrain.models.profile import layer_profile
from geotrain.planner.profile import LayerProfile, transformer_profile


@pytest.mark.parametrize("preset", ["tiny", "1b"])
def test_measured_profile_matches_the_planners_formula(preset: str) -> None:
    cfg = GPTConfig.preset(preset)
    measured = layer_profile(cfg)
    formula = transformer_profile(
        layers=cfg.n_layer, hidden=cfg.d_model, seq_len=cfg.seq_len, vocab=cfg.vocab_size, dtype_bytes=4
    )
    assert len(measured) == cfg.num_blocks and all(isinstance(p, LayerProfile) for p in measured)
    for m, f in zip(measured[1:], formula[1:], strict=True):  # the embedding lookup has no matmul to count
        assert m.flops_per_token == pytest.approx(f.flops_per_token, rel=1e-9)
        assert m.param_bytes == f.param_bytes
        assert m.activation_bytes_per_token == f.activation_bytes_per_token
    assert measured[0].param_bytes == formula[0].param_bytes
    assert measured[-1].activation_bytes_per_token == 0


def test_profile_of_a_user_model_needs_and_uses_a_sample() -> None:
    model = BlockList(blocks=[nn.Embedding(10, 8), nn.Linear(8, 8), nn.Linear(8, 10)], seed=0)
    with pytest.raises(ConfigError, match="sample_input"):
        layer_profile(model)
    prof = layer_profile(model, sample_input=torch.zeros(1, 5, dtype=torch.long))
    assert [p.param_bytes for p in prof] == [320, 288, 360]
    assert prof[1].flops_per_token == 3 * 2 * 8 * 8  # fwd + 2x bwd of an 8x8 matmul
    assert [p.activation_bytes_per_token for p in prof] == [32, 32, 0]
    assert model.blocks[1].weight.device.type == "cpu"  # profiled on meta copies
