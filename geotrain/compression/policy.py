"""Codec policies: which codec a tensor gets, by composition rather than flags.

A **role** says what a tensor is for: an ``activation`` (forward, pipeline hop),
an ``activation_grad`` (backward, pipeline hop) or a ``pseudo_grad`` (the
DiLoCo outer gradient, global minus local parameters, all-reduced per round).
A **policy** maps (role, size, dtype) to a codec spec. Policies nest:

    ByRole(
        activation=BySize(threshold=4096, small="fp16", large="int8"),
        activation_grad="int8",
        pseudo_grad=BySize(threshold=4096, small="none", large="topk:fraction=0.01"),
    )

Small tensors (norms, biases) stay fp16/fp32: they are few bytes and
quantizing them costs accuracy for nothing. :func:`policy_from_config`
builds the same tree from plain TOML/JSON values. Error feedback is stateful,
so it is not part of a policy: the sync code wraps lossy pseudo-gradient
codecs in :class:`~geotrain.compression.feedback.ErrorFeedback`.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

import torch

from geotrain.compression.base import Codec, Encoded, get_codec
from geotrain.errors import CodecError, ConfigError

__all__ = ["ByRole", "BySize", "Fixed", "Policy", "Role", "TensorInfo", "default_policy", "policy_from_config"]


class Role(str, enum.Enum):
    """What a tensor is for; decides how hard it may be compressed."""

    ACTIVATION = "activation"
    ACTIVATION_GRAD = "activation_grad"
    PSEUDO_GRAD = "pseudo_grad"


@dataclass(frozen=True, kw_only=True)
class TensorInfo:
    """What a policy may look at: role, element count, dtype, and an optional name."""

    role: Role
    numel: int
    dtype: torch.dtype = torch.float32
    name: str | None = None

    @classmethod
    def of(cls, x: torch.Tensor, role: Role | str, name: str | None = None) -> TensorInfo:
        return cls(role=Role(role), numel=x.numel(), dtype=x.dtype, name=name)


class Policy(abc.ABC):
    """Chooses a codec spec for a tensor."""

    @abc.abstractmethod
    def choose(self, info: TensorInfo) -> str:
        """The codec spec for this tensor."""

    def codec(self, info: TensorInfo) -> Codec:
        return get_codec(self.choose(info))

    def encode(self, x: torch.Tensor, role: Role | str, name: str | None = None) -> Encoded:
        """Encode ``x`` with the codec this policy picks for it."""
        return self.codec(TensorInfo.of(x, role, name)).encode(x)

    def estimate_ratio(self, info: TensorInfo) -> float:
        """Compression ratio the chosen codec promises for this tensor (for the planner)."""
        return self.codec(info).estimate_ratio(info.numel, info.dtype)


PolicyLike = Union[Policy, str]


def _as_policy(p: PolicyLike, where: str) -> Policy:
    if isinstance(p, Policy):
        return p
    if isinstance(p, str):
        return Fixed(spec=p)
    raise ConfigError(f"{where} must be a codec spec string or a Policy; got {type(p).__name__}")


@dataclass(frozen=True, kw_only=True)
class Fixed(Policy):
    """Always the same codec."""

    spec: str

    def __post_init__(self) -> None:
        try:
            get_codec(self.spec)
        except CodecError as exc:
            raise ConfigError(f"policy codec {self.spec!r} is not usable: {exc}") from exc

    def choose(self, info: TensorInfo) -> str:
        return self.spec


@dataclass(frozen=True, kw_only=True)
class BySize(Policy):
    """``small`` for tensors of fewer than ``threshold`` elements, ``large`` otherwise."""

    threshold: int
    small: PolicyLike
    large: PolicyLike

    def __post_init__(self) -> None:
        if type(self.threshold) is not int or self.threshold < 0:
            raise ConfigError(f"BySize threshold must be a non-negative int (elements); got {self.threshold!r}")
        object.__setattr__(self, "small", _as_policy(self.small, "BySize.small"))
        object.__setattr__(self, "large", _as_policy(self.large, "BySize.large"))

    def choose(self, info: TensorInfo) -> str:
        branch = self.small if info.numel < self.threshold else self.large
        assert isinstance(branch, Policy)
        return branch.choose(info)


@dataclass(frozen=True, kw_only=True)
class ByRole(Policy):
    """One policy per role; a role left unset uses ``default``."""

    activation: PolicyLike | None = None
    activation_grad: PolicyLike | None = None
    pseudo_grad: PolicyLike | None = None
    default: PolicyLike = "fp16"

    def __post_init__(self) -> None:
        for field in ("activation", "activation_grad", "pseudo_grad", "default"):
            value = getattr(self, field)
            if value is not None:
                object.__setattr__(self, field, _as_policy(value, f"ByRole.{field}"))

    def choose(self, info: TensorInfo) -> str:
        branch = getattr(self, Role(info.role).value) or self.default
        assert isinstance(branch, Policy)
        return branch.choose(info)


def default_policy() -> Policy:
    """Defaults for WAN hops and rounds: int8 activations/gradients, top-k pseudo-gradients.

    Tensors under 4096 elements stay fp16 (activations) or fp32 (pseudo-gradients).
    """
    return ByRole(
        activation=BySize(threshold=4096, small="fp16", large="int8"),
        activation_grad=BySize(threshold=4096, small="fp16", large="int8"),
        pseudo_grad=BySize(threshold=4096, small="none", large="topk:fraction=0.01"),
    )


def policy_from_config(value: Any) -> Policy:
    """Build a policy from plain config values.

    - ``"int8"``: :class:`Fixed`;
    - ``{"threshold": 4096, "small": ..., "large": ...}``: :class:`BySize`;
    - ``{"activation": ..., "activation_grad": ..., "pseudo_grad": ..., "default": ...}``: :class:`ByRole`;
    nested values are built the same way.
    """
    if isinstance(value, Policy):
        return value
    if isinstance(value, str):
        return Fixed(spec=value)
    if isinstance(value, Mapping):
        keys = set(value)
        if "threshold" in keys:
            if keys != {"threshold", "small", "large"}:
                raise ConfigError(f"a size policy needs exactly threshold, small, large; got {sorted(keys)}")
            return BySize(
                threshold=value["threshold"],
                small=policy_from_config(value["small"]),
                large=policy_from_config(value["large"]),
            )
        roles = {r.value for r in Role} | {"default"}
        unknown = keys - roles
        if unknown:
            raise ConfigError(f"unknown policy keys {sorted(unknown)}; use threshold/small/large or {sorted(roles)}")
        return ByRole(**{k: policy_from_config(v) for k, v in value.items()})
    raise ConfigError(f"a codec policy is a spec string or a table; got {type(value).__name__}")
