"""Pure pieces: config checks, fragment cuts, robust aggregation, screening, outer SGD."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from geotrain.errors import ConfigError
from geotrain.sync import DiLoCoConfig, OuterState, split_fragments
from geotrain.sync.aggregate import Contribution, aggregate, centered_clip, screen, trimmed_mean


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("every", 0, "sync.every"),
        ("outer_momentum", 1.0, "outer_momentum"),
        ("cross_codec", "int3", "not a codec"),
        ("fragments", 5, "<= sync.every"),
        ("overlap", 4, "overlap"),
        ("aggregation", "median", "aggregation"),
        ("quorum", 0.0, "quorum"),
    ],
)
def test_config_errors_name_the_fix(field: str, value: object, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        DiLoCoConfig(**{"every": 4, field: value})  # type: ignore[arg-type]


def test_fragments_cover_params_in_order_and_balance() -> None:
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])
    params = list(model.named_parameters())
    frags = split_fragments(params, 4)
    assert [n for f in frags for n in f.names] == [n for n, _ in params]
    sizes = [f.numel for f in frags]
    assert sizes == [72, 72, 72, 72]
    with pytest.raises(ConfigError):
        split_fragments(params, 9)


def test_fragment_offsets_are_staggered() -> None:
    config = DiLoCoConfig(every=12, fragments=3)
    assert [config.fragment_offset(p) for p in range(3)] == [0, 4, 8]


def test_trimmed_mean_drops_extremes() -> None:
    x = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [1000.0, -1000.0], [4.0, 40.0]])
    out = trimmed_mean(x, 0.2)
    torch.testing.assert_close(out, torch.tensor([3.0, 20.0]))


def test_centered_clip_bounds_an_outlier() -> None:
    g = torch.Generator().manual_seed(0)
    honest = torch.randn(6, 50, generator=g) * 0.1 + 1.0
    attacker = torch.full((1, 50), 1e6)
    out = centered_clip(torch.cat([honest, attacker]), iters=3)
    assert float((out - honest.mean(0)).abs().max()) < 0.5
    plain = torch.cat([honest, attacker]).mean(0)
    assert float(plain.abs().max()) > 1e4


def test_aggregate_mean_weights_region_sums() -> None:
    config = DiLoCoConfig()
    a = Contribution(torch.tensor([2.0, 4.0]), ("a", "b"))  # sum of two members
    c = Contribution(torch.tensor([4.0, 5.0]), ("c",))
    torch.testing.assert_close(aggregate([a, c], config=config), torch.tensor([2.0, 3.0]))
    with pytest.raises(ValueError, match="one vector per member"):
        aggregate([a, c], config=DiLoCoConfig(aggregation="trimmed_mean"))


def test_screen_names_nan_and_absurd_norm() -> None:
    config = DiLoCoConfig()
    values = {f"p{i}": torch.ones(4) * (1 + i * 0.1) for i in range(4)}
    values["nan"] = torch.tensor([1.0, float("nan"), 0.0, 0.0])
    values["huge"] = torch.ones(4) * 1e4
    accepted, excluded = screen(values, config=config)
    assert sorted(excluded) == ["huge", "nan"]
    assert "NaN" in excluded["nan"] and "median" in excluded["huge"]
    assert sorted(accepted) == ["p0", "p1", "p2", "p3"]


def test_outer_state_matches_torch_sgd_nesterov() -> None:
    config = DiLoCoConfig(outer_lr=0.7, outer_momentum=0.9)
    p = nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    ref = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True)
    state = OuterState(p.detach().clone(), config)
    for k in range(4):
        g = torch.tensor([0.1, -0.3, 0.2]) * (k + 1)
        p.grad = g.clone()
        ref.step()
        state.step(g)
    torch.testing.assert_close(state.global_flat, p.detach(), atol=1e-7, rtol=0)
    restored = OuterState(torch.zeros(3), config)
    restored.load_state_dict(state.state_dict())
    assert restored.version == 4 and torch.equal(restored.momentum, state.momentum)  # type: ignore[arg-type]
