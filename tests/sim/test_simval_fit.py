"""``benchmarks.simval.fit_overheads``: unexplained time per inner step = a + b / H, from runs at two H."""

from __future__ import annotations

import pytest

from benchmarks.simval import fit_overheads


def test_two_runs_two_unknowns() -> None:
    a, b, clamped = fit_overheads([(10, 0.01 + 1.4 / 10), (20, 0.01 + 1.4 / 20)])
    assert (a, b) == (pytest.approx(0.01), pytest.approx(1.4)) and clamped == []


def test_more_runs_least_squares() -> None:
    a, b, clamped = fit_overheads([(h, 0.02 + 0.5 / h) for h in (5, 10, 40)])
    assert (a, b) == (pytest.approx(0.02), pytest.approx(0.5)) and clamped == []


def test_negative_step_term_is_clamped_and_the_round_term_refitted() -> None:
    # u falls faster than 1 / H: the exact fit wants a < 0
    a, b, clamped = fit_overheads([(10, 0.10), (20, 0.03)])
    assert a == 0.0 and clamped == ["step_overhead_s"]
    # the least-squares line through the origin in 1 / H
    assert b == pytest.approx((0.10 / 10 + 0.03 / 20) / (1 / 100 + 1 / 400))


def test_time_growing_with_h_has_no_round_term() -> None:
    a, b, clamped = fit_overheads([(10, 0.05), (20, 0.07)])
    assert (a, b) == (pytest.approx(0.06), 0.0) and clamped == ["round_overhead_s"]


def test_one_h_fits_the_step_term_only() -> None:
    assert fit_overheads([(10, 0.15)]) == (0.15, 0.0, [])
    assert fit_overheads([(10, -0.01)]) == (0.0, 0.0, ["step_overhead_s"])
    with pytest.raises(ValueError):
        fit_overheads([])
