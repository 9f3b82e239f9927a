"""Network models: per-message delay, bandwidth, and fault injection for the links between learner and samplers.

Pure objects, no I/O: every random draw goes through a `numpy.random.Generator` handed in or owned by a `Link`,
so the same config and seed give the same delays bit for bit. The simulated cluster turns these numbers into
virtual time; the live cluster may use them to inject artificial delay and loss into a real transport.

Delay models (chosen by the config's `kind`, see `make_delay`):

- fixed:        delay = seconds
- uniform:      delay ~ U[low, high]
- exponential:  delay = offset + Exp(mean)
- lognormal:    HeteroRL's band-fitted log-normal, shifted by `offset` and clipped to [lower, upper]
- weibull:      the same construction with a Weibull distribution

A message's transfer time on a link is `delay + nbytes * 8 / (bandwidth_mbps * 1e6)` (no bandwidth term when the
bandwidth is unlimited).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal

import numpy as np

from heterorl.config import (
    DelayConfig,
    ExponentialDelay,
    FaultConfig,
    FixedDelay,
    LinkConfig,
    LogNormalDelay,
    UniformDelay,
    WeibullDelay,
)

LinkPath = Literal["weights", "rollout"]
"""The two directions of a link: weights travel learner -> sampler, rollout groups sampler -> learner."""


# --- delay models
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


# --- fault injection
@dataclass(frozen=True)
class Delivery:
    """One arrival of a message: when, what, and which faults shaped it (for counters)."""

    at: float
    payload: bytes
    duplicate: bool = False
    reordered: bool = False
    corrupted: bool = False


class FaultInjector:
    """Applies a `FaultConfig` to messages, one independent decision per fault and message.

    Each message consumes exactly six uniforms from the generator, whatever happens to it:
    [drop, duplicate, reorder, corrupt, corrupt position, corrupt mask]. So the k-th message's fate depends only
    on the seed and k, and raising one probability never changes which messages suffer another fault.

    Semantics, in order: a dropped message yields no delivery. A reordered one arrives `reorder_seconds` late
    (so later messages may overtake it). A corrupted one has one byte XORed with a nonzero mask (position and
    mask uniform; an empty payload cannot be corrupted and passes unchanged). A duplicated one arrives twice,
    the copy right after the original, with the same (possibly corrupted) bytes and time.
    """

    DRAWS_PER_MESSAGE = 6

    def __init__(self, cfg: FaultConfig, rng: np.random.Generator) -> None:
        self.cfg = cfg
        self.rng = rng

    @property
    def active(self) -> bool:
        """False when every probability is 0 (then `apply` never alters a message)."""
        c = self.cfg
        return max(c.drop, c.duplicate, c.reorder, c.corrupt) > 0.0

    def apply(self, payload: bytes, deliver_at: float) -> list[Delivery]:
        """Deliveries to perform for a message scheduled to arrive at `deliver_at`: [] if dropped, else one
        (or two when duplicated)."""
        u_drop, u_dup, u_reorder, u_corrupt, u_pos, u_mask = self.rng.random(self.DRAWS_PER_MESSAGE)
        c = self.cfg
        if u_drop < c.drop:
            return []
        reordered = bool(u_reorder < c.reorder)
        at = deliver_at + c.reorder_seconds if reordered else deliver_at
        corrupted = bool(u_corrupt < c.corrupt) and len(payload) > 0
        if corrupted:
            payload = flip_byte(payload, int(u_pos * len(payload)), 1 + int(u_mask * 255))
        first = Delivery(at, payload, reordered=reordered, corrupted=corrupted)
        if u_dup < c.duplicate:
            return [first, Delivery(at, payload, duplicate=True, reordered=reordered, corrupted=corrupted)]
        return [first]


def flip_byte(payload: bytes, position: int, mask: int) -> bytes:
    """Return `payload` with byte `position` XORed with `mask` (1..255, so the byte always changes)."""
    assert 0 <= position < len(payload), f"position {position} outside a payload of {len(payload)} bytes"
    assert 1 <= mask <= 255, f"mask {mask} must be in 1..255"
    out = bytearray(payload)
    out[position] ^= mask
    return bytes(out)


# --- links
_NETWORK_DOMAIN = 0x6E6574  # "net": keeps network streams apart from other users of the run seed
_PATH_IDS: dict[str, int] = {"weights": 0, "rollout": 1}
_PURPOSE_IDS: dict[str, int] = {"delay": 0, "faults": 1}


def link_rng(seed: int, link_index: int, path: LinkPath, purpose: Literal["delay", "faults"]) -> np.random.Generator:
    """The generator of one stream of one link.

    Seeding scheme: `SeedSequence(seed, spawn_key=(0x6E6574, link_index, path_id, purpose_id))` with path_id
    weights=0 / rollout=1 and purpose_id delay=0 / faults=1. Streams are addressed by key, not spawned in
    order, so adding a sampler, enabling faults, or drawing more from one path never shifts another stream.
    """
    key = (_NETWORK_DOMAIN, link_index, _PATH_IDS[path], _PURPOSE_IDS[purpose])
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def bandwidth_seconds(nbytes: int, bandwidth_mbps: float | None) -> float:
    """Serialisation time nbytes * 8 / (bandwidth_mbps * 1e6); 0 for unlimited bandwidth."""
    assert nbytes >= 0, f"negative size {nbytes}"
    if bandwidth_mbps is None:
        return 0.0
    return nbytes * 8.0 / (bandwidth_mbps * 1e6)


class Link:
    """A sampler's link to the learner: a delay model and fault injector per path, one bandwidth for both.

    transfer time = delay sample + nbytes * 8 / (bandwidth_mbps * 1e6).

    The link owns four generators (see `link_rng`): delay and faults, for each path. Methods taking an optional
    `rng` use the link's own stream of that path when it is None.
    """

    def __init__(self, cfg: LinkConfig, seed: int, index: int = 0) -> None:
        self.cfg = cfg
        self.index = index
        self.delays: dict[str, DelayModel] = {
            "weights": make_delay(cfg.weights_delay),
            "rollout": make_delay(cfg.rollout_delay),
        }
        self.delay_rngs = {p: link_rng(seed, index, p, "delay") for p in ("weights", "rollout")}
        self.faults = {
            "weights": FaultInjector(cfg.weights_faults, link_rng(seed, index, "weights", "faults")),
            "rollout": FaultInjector(cfg.rollout_faults, link_rng(seed, index, "rollout", "faults")),
        }

    def transfer_seconds(self, path: LinkPath, nbytes: int, rng: np.random.Generator | None = None) -> float:
        """Time for one message of `nbytes` on `path`: a delay sample plus the bandwidth term."""
        gen = self.delay_rngs[path] if rng is None else rng
        return self.delays[path].sample(gen) + bandwidth_seconds(nbytes, self.cfg.bandwidth_mbps)

    def weights_transfer_seconds(self, nbytes: int, rng: np.random.Generator | None = None) -> float:
        """Learner -> sampler transfer time of a weight update of `nbytes`."""
        return self.transfer_seconds("weights", nbytes, rng)

    def rollout_transfer_seconds(self, nbytes: int, rng: np.random.Generator | None = None) -> float:
        """Sampler -> learner transfer time of a rollout message of `nbytes`."""
        return self.transfer_seconds("rollout", nbytes, rng)

    def transmit(self, path: LinkPath, payload: bytes, sent_at: float) -> list[Delivery]:
        """Send `payload` at `sent_at`: the deliveries after transfer time and faults (possibly none)."""
        arrive = sent_at + self.transfer_seconds(path, len(payload))
        return self.faults[path].apply(payload, arrive)
