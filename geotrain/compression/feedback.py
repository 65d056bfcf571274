"""Error feedback: send later what a lossy codec dropped now.

The **residual** of a tensor is everything its codec has failed to transmit so
far: ``residual_t = (x_t + residual_{t-1}) - decode(encode(x_t + residual_{t-1}))``.
Adding it to the next input makes the *sum* of decoded outputs track the sum
of inputs: after T rounds they differ by exactly ``residual_T``, which stays
bounded, instead of by an error that grows with T (DeMo, SparseLoCo and
CocktailSGD use this with top-k).

The residual belongs to the caller, one per tensor (or fragment), in an
:class:`ErrorFeedbackState`. ``encode`` never mutates the state it is given
and returns a new one, so a caller whose round is discarded simply keeps the
old state and retries: nothing is lost and nothing is counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from geotrain.compression.base import Codec, Encoded, check_input, get_codec
from geotrain.errors import CodecError, ConfigError

__all__ = ["ErrorFeedback", "ErrorFeedbackConfig", "ErrorFeedbackState"]


@dataclass(frozen=True)
class ErrorFeedbackState:
    """The caller-held residual of one tensor: fp32, the tensor's shape; ``rounds`` encoded so far."""

    residual: torch.Tensor
    rounds: int = 0

    @property
    def norm(self) -> float:
        """L2 norm of the residual (how much is still owed to the receiver)."""
        return float(torch.linalg.vector_norm(self.residual))


@dataclass(frozen=True, kw_only=True)
class ErrorFeedbackConfig:
    """Options of error feedback.

    ``codec``: spec of the lossy codec to wrap (``"topk:fraction=0.01"``, ``"int4"``...).
    ``decay``: multiplier on the residual before it is added back; 1.0 is classic
    error feedback, below 1 forgets old error (DeMo-style momentum decay).
    """

    codec: str = "topk"
    decay: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.codec, str) or not self.codec:
            raise ConfigError(f"error feedback codec must be a codec spec like 'topk:fraction=0.01'; got {self.codec!r}")
        if not isinstance(self.decay, int | float) or not 0.0 < float(self.decay) <= 1.0:
            raise ConfigError(f"error feedback decay must be in (0, 1]; got {self.decay!r}")


class ErrorFeedback:
    """Wrap a lossy codec so that its error is carried to the next round (see module docstring)."""

    def __init__(self, codec: Codec | str | ErrorFeedbackConfig, *, decay: float = 1.0) -> None:
        if isinstance(codec, ErrorFeedbackConfig):
            self.config = codec
        else:
            spec = codec.spec if isinstance(codec, Codec) else codec
            self.config = ErrorFeedbackConfig(codec=spec, decay=decay)
        self.codec = codec if isinstance(codec, Codec) else get_codec(self.config.codec)

    def initial_state(self, like: torch.Tensor) -> ErrorFeedbackState:
        """A zero residual for tensors shaped like ``like``."""
        return ErrorFeedbackState(residual=torch.zeros(like.shape, dtype=torch.float32))

    def encode(self, x: torch.Tensor, state: ErrorFeedbackState | None) -> tuple[Encoded, ErrorFeedbackState]:
        """Encode ``x + decay * residual``; return the encoding and the next state.

        The encoding decodes (with the wrapped codec's ordinary decoder) to
        ``x``'s shape and dtype. ``state=None`` starts from a zero residual.
        """
        x = check_input(x)
        corrected = x.float()  # (shape of x,) fp32: the residual is accumulated at full precision
        if corrected.data_ptr() == x.data_ptr():
            corrected = corrected.clone()
        if state is not None:
            if tuple(state.residual.shape) != tuple(x.shape):
                raise CodecError(
                    f"error feedback residual has shape {tuple(state.residual.shape)} but the tensor has "
                    f"{tuple(x.shape)}; keep one state per tensor (or fragment)"
                )
            decay = float(self.config.decay)
            corrected.add_(state.residual, alpha=decay)
        # what the receiver sees is the corrected tensor in x's dtype; casting first makes the
        # bf16/fp16 rounding part of the residual too
        to_send = corrected if x.dtype == torch.float32 else corrected.to(x.dtype)
        encoded = self.codec.encode(to_send)
        received = self.codec.decode(encoded.meta, encoded.buffers)  # what the peer will reconstruct
        residual = corrected.sub_(received.float())  # reuse the fp32 buffer: it is ours
        rounds = 0 if state is None else state.rounds
        return encoded, ErrorFeedbackState(residual=residual, rounds=rounds + 1)
