"""Calibration's statistics against hand-computed values."""

from __future__ import annotations

import math

import pytest

from heterorl.calibrate.fit import (
    Z95,
    line_fit,
    mean_estimate,
    nonnegative_cost_fit,
    quantile_points,
    ratio_of_sums,
)
from heterorl.calibrate.measure import link_direction, sizes_vary


def test_ratio_of_sums_weights_items_by_their_denominator() -> None:
    # tokens 100, 300 over 1 s and 2 s: 400 / 3 s, not the mean of 100 and 150 tokens/s
    e = ratio_of_sums([100.0, 300.0], [1.0, 2.0])
    assert e.value == pytest.approx(400 / 3)
    # residuals y - R x: 100 - 133.33 = -33.33, 300 - 266.67 = 33.33; se = sqrt(2 * 33.33^2 / 1 / 2) / 1.5 = 22.22
    se = math.sqrt(2 * (100 / 3) ** 2 / 1 / 2) / 1.5
    assert (e.low, e.high) == pytest.approx((400 / 3 - Z95 * se, 400 / 3 + Z95 * se))
    assert e.spread == pytest.approx(math.sqrt(((100 - 125) ** 2 + (150 - 125) ** 2) / 1))  # sd of 100 and 150
    assert math.isnan(ratio_of_sums([5.0], [1.0]).low)  # one item: no interval


def test_mean_estimate() -> None:
    e = mean_estimate([1.0, 2.0, 3.0])
    assert e.value == 2.0
    assert e.spread == 1.0
    assert (e.low, e.high) == pytest.approx((2 - Z95 / math.sqrt(3), 2 + Z95 / math.sqrt(3)))


def test_line_fit_recovers_an_exact_line_and_its_intervals_shrink_to_it() -> None:
    x = [1.0, 2.0, 3.0, 4.0]
    fit = line_fit(x, [0.5 + 0.25 * v for v in x])
    assert fit.identifiable
    assert fit.slope.value == pytest.approx(0.25)
    assert fit.intercept.value == pytest.approx(0.5)
    assert fit.slope.high - fit.slope.low == pytest.approx(0.0, abs=1e-12)
    assert fit.slope_significant


def test_line_fit_standard_errors_are_the_textbook_ones() -> None:
    x, y = [0.0, 1.0, 2.0], [0.0, 2.0, 1.0]
    fit = line_fit(x, y)
    # slope = Sxy / Sxx = ((-1)(-1) + 0 + (1)(0)) / 2 = 0.5; intercept = 1 - 0.5 * 1 = 0.5
    assert fit.slope.value == pytest.approx(0.5)
    assert fit.intercept.value == pytest.approx(0.5)
    # residuals -0.5, 1, -0.5: s^2 = 1.5 / 1; se(slope) = sqrt(1.5 / 2); se(intercept) = sqrt(1.5 (1/3 + 1/2))
    assert fit.slope.high - fit.slope.value == pytest.approx(Z95 * math.sqrt(0.75))
    assert fit.intercept.high - fit.intercept.value == pytest.approx(Z95 * math.sqrt(1.5 * 5 / 6))
    assert not fit.slope_significant  # its interval holds 0


def test_a_constant_x_cannot_tell_a_slope_so_the_fit_is_the_mean() -> None:
    fit = line_fit([3.0, 3.0, 3.0], [1.0, 2.0, 3.0])
    assert not fit.identifiable
    assert fit.slope.value == 0.0
    assert fit.intercept.value == 2.0


def test_a_cost_is_never_negative() -> None:
    falling = nonnegative_cost_fit([1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0])  # no per-unit cost: the mean
    assert (falling.intercept.value, falling.slope.value) == (2.5, 0.0)
    through_zero = nonnegative_cost_fit([1.0, 2.0, 3.0], [0.5, 2.0, 3.5])  # line -1 + 1.5 x: no fixed cost
    assert through_zero.intercept.value == 0.0
    assert through_zero.slope.value == pytest.approx((0.5 + 4.0 + 10.5) / (1 + 4 + 9))  # sum(xy) / sum(x^2)


def test_quantile_points() -> None:
    q = quantile_points([0.0, 1.0, 2.0, 3.0, 4.0], points=5)
    assert q == {0.0: 0.0, 0.25: 1.0, 0.5: 2.0, 0.75: 3.0, 1.0: 4.0}


def test_a_rate_needs_sizes_that_vary_by_a_quarter() -> None:
    # patches of 543-545 bytes whose delays happen to rise with the 2 bytes: a perfect, "significant" slope of
    # 10 ms per byte (0.0008 Mbit/s) that is jitter, not a link's rate, so no rate and the delays stay as measured
    sizes = [543.0, 544.0, 545.0] * 4
    delays = [0.05 + 0.01 * (b - 543.0) for b in sizes]
    assert line_fit(sizes, delays).slope_significant
    narrow = link_direction(sizes, delays)
    assert narrow.rate_mbps is None
    assert narrow.delays == pytest.approx(delays)
    # sizes from 1 kB to 100 kB on a 10 Mbit/s link with a 50 ms delay: the rate and the delay come back
    sizes = [1e3, 5e4, 1e5] * 4
    wide = link_direction(sizes, [0.05 + b * 8 / 10e6 for b in sizes])
    assert wide.rate_mbps is not None
    assert wide.rate_mbps.value == pytest.approx(10.0)
    assert wide.delays == pytest.approx([0.05] * len(sizes))
    assert not sizes_vary([300.0, 399.0])
    assert sizes_vary([300.0, 400.0])
    assert not sizes_vary([])
