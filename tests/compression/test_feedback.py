"""Error feedback: over 200 rounds of a fixed random stream, decoded sums track true sums."""

from __future__ import annotations

import pytest
import torch

from geotrain.compression import ErrorFeedback, ErrorFeedbackConfig, get_codec
from geotrain.errors import CodecError, ConfigError

N = 16384
ROUNDS = 200


def _stream(seed: int) -> list[torch.Tensor]:
    """A pseudo-gradient-like stream: a steady direction plus fresh noise each round."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(N, generator=gen) * 0.5
    return [g + torch.randn(N, generator=gen) for _ in range(ROUNDS)]


@pytest.mark.parametrize(
    ("spec", "max_err", "max_growth"),
    [("topk:fraction=0.05", 0.06, 1.05), ("topk", 0.3, 1.25), ("int4", 0.005, 1.05), ("int8", 0.001, 1.05)],
)
def test_sum_of_decoded_tracks_true_sum_without_drift(spec: str, max_err: float, max_growth: float) -> None:
    codec = get_codec(spec)
    ef = ErrorFeedback(spec)
    state = None
    sum_true, sum_ef, sum_plain = torch.zeros(N), torch.zeros(N), torch.zeros(N)
    norms = []
    for x in _stream(seed=11):
        enc, state = ef.encode(x, state)
        sum_ef += codec.decode(enc.meta, enc.buffers)  # what a receiver accumulates
        plain = codec.encode(x)
        sum_plain += codec.decode(plain.meta, plain.buffers)
        sum_true += x
        norms.append(state.norm)
    assert state is not None and state.rounds == ROUNDS
    # the gap between the sums is exactly the residual still owed (telescoping sum)
    assert float((sum_true - sum_ef - state.residual).norm()) <= 1e-5 * float(sum_true.norm())
    # bounded: the residual stops growing once every entry has had its turn
    assert norms[-1] <= max_growth * norms[ROUNDS // 2 - 1]
    ef_err = float((sum_ef - sum_true).norm() / sum_true.norm())
    plain_err = float((sum_plain - sum_true).norm() / sum_true.norm())
    assert ef_err <= max_err
    assert ef_err * 4 <= plain_err  # without feedback the dropped mass piles up


def test_state_is_not_mutated_so_a_failed_round_can_be_retried() -> None:
    ef = ErrorFeedback("topk:fraction=0.05")
    x = torch.randn(4096)
    _, s1 = ef.encode(x, None)
    before = s1.residual.clone()
    enc_a, s2a = ef.encode(x, s1)
    enc_b, s2b = ef.encode(x, s1)  # the round was discarded: same input, same old state
    assert torch.equal(s1.residual, before)
    assert torch.equal(s2a.residual, s2b.residual)
    assert all(torch.equal(a, b) for a, b in zip(enc_a.buffers, enc_b.buffers, strict=True))
    assert s2a.rounds == 2


def test_low_precision_inputs_keep_their_dtype_and_an_fp32_residual() -> None:
    ef = ErrorFeedback(get_codec("int4"))
    x = torch.randn(3, 1000).to(torch.bfloat16)
    enc, state = ef.encode(x, ef.initial_state(x))
    y = get_codec(enc.codec).decode(enc.meta, enc.buffers)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    assert state.residual.dtype == torch.float32 and state.residual.shape == x.shape
    assert torch.allclose(state.residual, x.float() - y.float(), atol=1e-2)


def test_mismatched_state_and_bad_config_are_refused() -> None:
    ef = ErrorFeedback("int8")
    _, state = ef.encode(torch.randn(100), None)
    with pytest.raises(CodecError, match="one state per tensor"):
        ef.encode(torch.randn(101), state)
    with pytest.raises(ConfigError):
        ErrorFeedbackConfig(codec="int8", decay=0.0)
    with pytest.raises(CodecError):
        ErrorFeedback("nonsense")


def test_decay_forgets_part_of_the_residual() -> None:
    x = torch.randn(4096)
    full = ErrorFeedback("topk:fraction=0.05")
    half = ErrorFeedback(ErrorFeedbackConfig(codec="topk:fraction=0.05", decay=0.5))
    _, s_full = full.encode(x, None)
    _, s_half = half.encode(x, None)
    assert torch.equal(s_full.residual, s_half.residual)  # first round: nothing to decay yet
    _, s_full = full.encode(torch.zeros(4096), s_full)
    _, s_half = half.encode(torch.zeros(4096), s_half)
    assert s_half.norm < s_full.norm
