"""The statistics of calibration, each with how sure it is: a ratio of sums, a straight-line fit, quantiles.

Intervals are normal-approximation 95% intervals (z = 1.96) from the usual standard errors; with few points
(n < 30) they are optimistic, which is why every estimate carries its count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z95 = 1.959964  # the standard normal's 97.5% quantile


@dataclass(frozen=True)
class Estimate:
    """A measured value: its count, spread (the sample standard deviation of what was averaged, or of the fit's
    residuals) and 95% confidence interval (NaN when it cannot be computed: one point)."""

    value: float
    n: int
    spread: float = math.nan
    low: float = math.nan
    high: float = math.nan

    @property
    def relative_half_width(self) -> float:
        """Half the interval's width over the value (how sure, as a share of the value)."""
        if not math.isfinite(self.low) or self.value == 0:
            return math.nan
        return (self.high - self.low) / 2.0 / abs(self.value)


def ratio_of_sums(numerators: list[float], denominators: list[float]) -> Estimate:
    """R = sum(y) / sum(x) (e.g. tokens over busy seconds: a speed weighted by work, as the simulator spends it),
    with the ratio estimator's standard error

        se(R) = sqrt( sum((y_i - R x_i)^2) / (n - 1) / n ) / mean(x).

    `spread` is the standard deviation of the per-item ratios y_i / x_i."""
    y, x = np.asarray(numerators, dtype=np.float64), np.asarray(denominators, dtype=np.float64)
    assert y.shape == x.shape, "one denominator per numerator"
    assert len(x) >= 1, "at least one item"
    assert np.all(x > 0), "denominators must be > 0"
    r = float(y.sum() / x.sum())
    n = len(x)
    if n < 2:
        return Estimate(r, n)
    se = math.sqrt(float(((y - r * x) ** 2).sum()) / (n - 1) / n) / float(x.mean())
    return Estimate(r, n, float(np.std(y / x, ddof=1)), r - Z95 * se, r + Z95 * se)


def mean_estimate(values: list[float]) -> Estimate:
    """The mean with its standard error s / sqrt(n); `spread` = s."""
    v = np.asarray(values, dtype=np.float64)
    assert len(v) >= 1, "at least one value"
    m = float(v.mean())
    if len(v) < 2:
        return Estimate(m, 1)
    s = float(np.std(v, ddof=1))
    half = Z95 * s / math.sqrt(len(v))
    return Estimate(m, len(v), s, m - half, m + half)


@dataclass(frozen=True)
class LineFit:
    """y = intercept + slope * x by least squares, each coefficient with its 95% interval."""

    intercept: Estimate
    slope: Estimate
    identifiable: bool  # x varied enough to tell the slope from noise (else slope = 0 and intercept = mean)

    @property
    def slope_significant(self) -> bool:
        """The slope's interval excludes 0 (the data show a per-unit cost at all)."""
        return self.identifiable and self.slope.low > 0.0


def line_fit(x: list[float], y: list[float]) -> LineFit:
    """Ordinary least squares with the textbook standard errors (residual variance s^2 = RSS / (n - 2)):

        slope = Sxy / Sxx,  intercept = mean(y) - slope * mean(x),
        se(slope) = s / sqrt(Sxx),  se(intercept) = s * sqrt(1/n + mean(x)^2 / Sxx).

    With fewer than 3 points or an x that (relative to its size) does not vary, the slope cannot be told from
    noise: the fit is then the mean of y with slope 0 (`identifiable` False)."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    assert xs.shape == ys.shape, "one y per x"
    assert len(xs) >= 1, "at least one point"
    n = len(xs)
    sxx = float(((xs - xs.mean()) ** 2).sum())
    if n < 3 or sxx <= (1e-9 * max(float(np.abs(xs).max()), 1.0)) ** 2 * n:
        mean = mean_estimate(list(ys))
        return LineFit(mean, Estimate(0.0, n), identifiable=False)
    slope = float(((xs - xs.mean()) * (ys - ys.mean())).sum() / sxx)
    intercept = float(ys.mean() - slope * xs.mean())
    residuals = ys - intercept - slope * xs
    s = math.sqrt(float((residuals**2).sum()) / (n - 2))
    se_slope = s / math.sqrt(sxx)
    se_intercept = s * math.sqrt(1.0 / n + float(xs.mean()) ** 2 / sxx)
    return LineFit(
        Estimate(intercept, n, s, intercept - Z95 * se_intercept, intercept + Z95 * se_intercept),
        Estimate(slope, n, s, slope - Z95 * se_slope, slope + Z95 * se_slope),
        identifiable=True,
    )


def nonnegative_cost_fit(x: list[float], y: list[float]) -> LineFit:
    """`line_fit` for a cost y = fixed + per_unit * x where neither part may be negative: a negative slope means the
    data show no per-unit cost (the mean alone); a negative intercept, no fixed cost (the line through 0,
    slope = sum(xy) / sum(x^2), se = s / sqrt(sum(x^2)))."""
    fit = line_fit(x, y)
    if not fit.identifiable or fit.slope.value < 0.0:
        return LineFit(mean_estimate(y), Estimate(0.0, len(x)), identifiable=fit.identifiable)
    if fit.intercept.value >= 0.0:
        return fit
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    sxx = float((xs**2).sum())
    slope = float((xs * ys).sum() / sxx)
    s = math.sqrt(float(((ys - slope * xs) ** 2).sum()) / max(len(xs) - 1, 1))
    half = Z95 * s / math.sqrt(sxx)
    return LineFit(Estimate(0.0, len(xs)), Estimate(slope, len(xs), s, slope - half, slope + half), identifiable=True)


def quantile_points(values: list[float], points: int = 21) -> dict[float, float]:
    """{p: the p-quantile} at `points` evenly spaced probabilities 0..1 (numpy's linear interpolation): a compact
    measured distribution for an `empirical` delay."""
    v = np.asarray(values, dtype=np.float64)
    probs = np.linspace(0.0, 1.0, points)
    return {round(float(p), 4): float(q) for p, q in zip(probs, np.quantile(v, probs), strict=True)}
