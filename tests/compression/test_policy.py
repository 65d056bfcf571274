"""Codec policies by role and size, and building them from config values."""

from __future__ import annotations

import pytest
import torch

from geotrain.compression import ByRole, BySize, Fixed, Role, TensorInfo, default_policy, policy_from_config
from geotrain.errors import ConfigError


def test_default_policy_by_role_and_size() -> None:
    p = default_policy()
    big, small = 1 << 20, 100
    assert p.choose(TensorInfo(role=Role.ACTIVATION, numel=big)) == "int8"
    assert p.choose(TensorInfo(role=Role.ACTIVATION, numel=small)) == "fp16"
    assert p.choose(TensorInfo(role=Role.ACTIVATION_GRAD, numel=big)) == "int8"
    assert p.choose(TensorInfo(role=Role.PSEUDO_GRAD, numel=big)).startswith("topk")
    assert p.choose(TensorInfo(role=Role.PSEUDO_GRAD, numel=small)) == "none"
    assert p.estimate_ratio(TensorInfo(role=Role.PSEUDO_GRAD, numel=big)) > 30


def test_policy_encodes_with_the_chosen_codec() -> None:
    p = ByRole(activation="int4", default="bf16")
    enc = p.encode(torch.randn(4096), Role.ACTIVATION)
    assert enc.codec.startswith("int4")
    assert p.encode(torch.randn(10), "pseudo_grad").codec == "bf16"


def test_policy_from_config_nests() -> None:
    p = policy_from_config(
        {
            "activation": {"threshold": 1000, "small": "fp16", "large": "int8:block=64"},
            "pseudo_grad": "int4",
            "default": "none",
        }
    )
    assert isinstance(p, ByRole) and isinstance(p.activation, BySize)
    assert p.choose(TensorInfo(role=Role.ACTIVATION, numel=999)) == "fp16"
    assert p.choose(TensorInfo(role=Role.ACTIVATION, numel=1000)) == "int8:block=64"
    assert p.choose(TensorInfo(role=Role.ACTIVATION_GRAD, numel=5)) == "none"
    assert isinstance(policy_from_config("fp16"), Fixed)


@pytest.mark.parametrize(
    "bad",
    [
        {"threshold": 10, "small": "fp16"},
        {"activations": "int8"},
        {"threshold": -1, "small": "fp16", "large": "int8"},
        "int9",
        "int8:block=7",
        42,
    ],
)
def test_bad_policy_configs_say_what_is_wrong(bad: object) -> None:
    with pytest.raises(ConfigError):
        policy_from_config(bad)


def test_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError):
        TensorInfo.of(torch.zeros(1), "weights")
