"""Delay models: distributions of one-way delays, chosen by the config's `kind` (see `make_delay`).

- fixed:        delay = seconds
- uniform:      delay ~ U[low, high]
- exponential:  delay = offset + Exp(mean)
- lognormal:    HeteroRL's band-fitted log-normal, shifted by `offset` and clipped to [lower, upper]
- weibull:      the same construction with a Weibull distribution
- empirical:    a measured distribution (samples or quantiles), drawn by inverse CDF with linear interpolation

Every draw goes through the `numpy.random.Generator` handed in, so the same seed gives the same delays.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from statistics import NormalDist

import numpy as np

from heterorl.config import (
    DelayConfig,
    EmpiricalDelay,
    ExponentialDelay,
    FixedDelay,
    LogNormalDelay,
    UniformDelay,
    WeibullDelay,
)


class DelayModel(ABC):
    """A distribution of one-way message delays, in seconds.

    Subclasses implement the vectorised `sample_many`; `sample` draws one value from the same stream, so
    `[m.sample(rng) for _ in range(n)]` equals `m.sample_many(n, rng)` for a generator in the same state.
    """

    @abstractmethod
    def sample_many(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Draw `n` delays (seconds) as a float64 array of shape (n,)."""

    def sample(self, rng: np.random.Generator) -> float:
        """Draw one delay (seconds)."""
        return float(self.sample_many(1, rng)[0])


_DELAY_REGISTRY: dict[str, Callable[[DelayConfig], DelayModel]] = {}


def register_delay(kind: str) -> Callable[[type[DelayModel]], type[DelayModel]]:
    """Class decorator: make `make_delay` build this model (via its `from_config`) for configs of `kind`."""

    def wrap(cls: type[DelayModel]) -> type[DelayModel]:
        assert kind not in _DELAY_REGISTRY, f"delay kind {kind!r} registered twice"
        _DELAY_REGISTRY[kind] = cls.from_config  # type: ignore[attr-defined]
        return cls

    return wrap


def make_delay(cfg: DelayConfig) -> DelayModel:
    """Build the delay model a config describes (looked up by `cfg.kind`)."""
    try:
        factory = _DELAY_REGISTRY[cfg.kind]
    except KeyError:
        raise ValueError(f"unknown delay kind {cfg.kind!r}; known: {sorted(_DELAY_REGISTRY)}") from None
    return factory(cfg)


@register_delay("fixed")
class Fixed(DelayModel):
    """delay = seconds. Draws nothing from the generator."""

    def __init__(self, seconds: float) -> None:
        assert seconds >= 0.0, f"negative delay {seconds}"
        self.seconds = float(seconds)

    @classmethod
    def from_config(cls, cfg: FixedDelay) -> Fixed:
        return cls(cfg.seconds)

    def sample_many(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, self.seconds, dtype=np.float64)


@register_delay("uniform")
class Uniform(DelayModel):
    """delay ~ U[low, high]; mean (low + high) / 2."""

    def __init__(self, low: float, high: float) -> None:
        assert 0.0 <= low <= high, f"need 0 <= low <= high, got {low}, {high}"
        self.low, self.high = float(low), float(high)

    @classmethod
    def from_config(cls, cfg: UniformDelay) -> Uniform:
        return cls(cfg.low, cfg.high)

    def sample_many(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(self.low, self.high, size=n)


@register_delay("exponential")
class Exponential(DelayModel):
    """delay = offset + Exp(mean): a floor (propagation) plus memoryless queueing; mean offset + mean."""

    def __init__(self, mean: float, offset: float = 0.0) -> None:
        assert mean > 0.0, f"mean must be > 0, got {mean}"
        assert offset >= 0.0, f"negative offset {offset}"
        self.mean, self.offset = float(mean), float(offset)

    @classmethod
    def from_config(cls, cfg: ExponentialDelay) -> Exponential:
        return cls(cfg.mean, cfg.offset)

    def sample_many(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self.offset + rng.exponential(self.mean, size=n)


def _band_tail(conf: float) -> float:
    """Mass left outside the band on each side: p = (1 - conf) / 2."""
    return (1.0 - conf) / 2.0


class BandDelay(DelayModel):
    """HeteroRL's construction: a heavy-tailed T fitted so that P(lower <= T <= upper) = conf, split evenly
    between the tails (P(T < lower) = P(T > upper) = (1 - conf) / 2), then

        delay = min(max(T - offset, lower), upper).

    The band pins the bulk of the distribution to a range one can read off a real network (say one minute to
    half an hour); `offset` shifts mass towards the floor, so a larger offset means more fast deliveries while the
    tail up to `upper` stays. Clipping keeps every delay inside [lower, upper] (the experiment's worst case).
    Subclasses supply the raw distribution (`raw_sample_many`, `cdf`).
    """

    def __init__(self, lower: float, upper: float, conf: float, offset: float = 0.0) -> None:
        assert 0.0 < lower < upper, f"need 0 < lower < upper, got {lower}, {upper}"
        assert 0.0 < conf < 1.0, f"conf must be in (0, 1), got {conf}"
        assert offset >= 0.0, f"negative offset {offset}"
        self.lower, self.upper, self.conf, self.offset = float(lower), float(upper), float(conf), float(offset)

    @classmethod
    def from_config(cls, cfg: LogNormalDelay | WeibullDelay) -> BandDelay:
        return cls(cfg.lower, cfg.upper, cfg.conf, cfg.offset)

    @property
    def tail(self) -> float:
        """Target mass of T below `lower` (and above `upper`): (1 - conf) / 2."""
        return _band_tail(self.conf)

    @abstractmethod
    def raw_sample_many(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Draw `n` values of T, before the shift and the clipping."""

    @abstractmethod
    def cdf(self, x: float) -> float:
        """P(T <= x) of the fitted raw distribution."""

    def sample_many(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.clip(self.raw_sample_many(n, rng) - self.offset, self.lower, self.upper)


@register_delay("lognormal")
class LogNormal(BandDelay):
    """T ~ LogNormal(mu, sigma) with z = Phi^-1(1 - (1 - conf) / 2) and

        ln(lower) = mu - z * sigma,   ln(upper) = mu + z * sigma
        => mu = (ln lower + ln upper) / 2,   sigma = (ln upper - ln lower) / (2 z).

    HeteroRL defaults (lower 60 s, upper 1920 s, conf 0.995): z = 2.807, mu = 5.827 (median sqrt(60 * 1920)
    = 339 s), sigma = 0.617.
    """

    @property
    def z(self) -> float:
        """Standard-normal quantile of the upper band edge."""
        return NormalDist().inv_cdf(1.0 - self.tail)

    @property
    def mu(self) -> float:
        """Mean of ln T."""
        return (math.log(self.lower) + math.log(self.upper)) / 2.0

    @property
    def sigma(self) -> float:
        """Standard deviation of ln T."""
        return (math.log(self.upper) - math.log(self.lower)) / (2.0 * self.z)

    def raw_sample_many(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.lognormal(self.mu, self.sigma, size=n)

    def cdf(self, x: float) -> float:
        """Phi((ln x - mu) / sigma)."""
        if x <= 0.0:
            return 0.0
        return NormalDist(self.mu, self.sigma).cdf(math.log(x))


@register_delay("weibull")
class Weibull(BandDelay):
    """T ~ Weibull(shape k, scale lam), CDF F(x) = 1 - exp(-(x / lam)^k), fitted to the band.

    Linearise: ln(-ln(1 - F(x))) = k ln x - k ln lam. With p = (1 - conf) / 2, a = ln(-ln(1 - p)) for
    F(lower) = p and b = ln(-ln p) for F(upper) = 1 - p:

        k = (b - a) / (ln upper - ln lower),   ln lam = ln lower - a / k.

    HeteroRL defaults (lower 60 s, upper 1920 s, conf 0.995): k = 2.245, lam = 865 s. The Weibull fitted to the
    same band as the log-normal is far less skewed (median ~ 735 s versus 339 s), so it puts more delays in the
    middle of the band.
    """

    @property
    def shape(self) -> float:
        """Weibull shape k."""
        p = self.tail
        a, b = math.log(-math.log1p(-p)), math.log(-math.log(p))
        return (b - a) / (math.log(self.upper) - math.log(self.lower))

    @property
    def scale(self) -> float:
        """Weibull scale lam (seconds)."""
        a = math.log(-math.log1p(-self.tail))
        return math.exp(math.log(self.lower) - a / self.shape)

    def raw_sample_many(self, n: int, rng: np.random.Generator) -> np.ndarray:
        # numpy's weibull is the unit-scale distribution: multiply by the scale.
        return self.scale * rng.weibull(self.shape, size=n)

    def cdf(self, x: float) -> float:
        """1 - exp(-(x / lam)^k), computed with expm1 so tiny probabilities keep their digits."""
        if x <= 0.0:
            return 0.0
        return -math.expm1(-((x / self.scale) ** self.shape))


@register_delay("empirical")
class Empirical(DelayModel):
    """A measured distribution, drawn by inverse CDF: u ~ U[0, 1), delay = F^-1(u), with F^-1 piecewise linear
    through its points (numpy.interp; below the first point and above the last the end values hold).

    From samples x_(1) <= ... <= x_(n): the points are (i / (n - 1), x_(i+1)) for i = 0..n-1 (the interpolated
    sample quantiles of numpy's default "linear" method), so the draws span [min, max] and a quantile of the draws
    converges to the same quantile of the samples. From quantiles {p_k: d_k}: the points (p_k, d_k), so the mass
    below the smallest p (above the largest) sits at its delay. One sample or one quantile is a fixed delay.
    """

    def __init__(self, probabilities: np.ndarray, delays: np.ndarray) -> None:
        assert probabilities.shape == delays.shape, "one probability per delay"
        assert probabilities.ndim == 1, "1-D points"
        assert len(delays) >= 1, "at least one point"
        assert np.all(np.diff(probabilities) > 0.0), "probabilities must increase"
        assert delays[0] >= 0.0, "delays must be >= 0"
        assert np.all(np.diff(delays) >= 0.0), "delays must not decrease"
        self.probabilities = probabilities.astype(np.float64)
        self.delays = delays.astype(np.float64)

    @classmethod
    def from_samples(cls, samples: list[float] | np.ndarray) -> Empirical:
        x = np.sort(np.asarray(samples, dtype=np.float64))
        if len(x) == 1:
            return cls(np.array([0.0]), x)
        return cls(np.linspace(0.0, 1.0, len(x)), x)

    @classmethod
    def from_quantiles(cls, quantiles: dict[float, float]) -> Empirical:
        points = sorted(quantiles.items())
        return cls(np.array([p for p, _ in points]), np.array([d for _, d in points]))

    @classmethod
    def from_config(cls, cfg: EmpiricalDelay) -> Empirical:
        if cfg.samples is not None:
            return cls.from_samples(cfg.samples)
        assert cfg.quantiles is not None
        return cls.from_quantiles(cfg.quantiles)

    def quantile(self, p: float | np.ndarray) -> np.ndarray:
        """F^-1(p), the delay at probability p (vectorised)."""
        return np.interp(p, self.probabilities, self.delays)

    def sample_many(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return self.quantile(rng.random(n))
