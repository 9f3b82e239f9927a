"""Delay models, links and fault injection: bounds, fitted quantiles, moments, seeding, transfer arithmetic."""

from __future__ import annotations

import math
from statistics import NormalDist
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heterorl.config import (
    ExponentialDelay,
    FaultConfig,
    FixedDelay,
    LinkConfig,
    LogNormalDelay,
    UniformDelay,
    WeibullDelay,
)
from heterorl.network import (
    BandDelay,
    Delivery,
    Exponential,
    FaultInjector,
    Fixed,
    Link,
    LogNormal,
    Uniform,
    Weibull,
    bandwidth_seconds,
    flip_byte,
    link_rng,
    make_delay,
)

N = 200_000
HETERO = {"lower": 60.0, "upper": 1920.0, "conf": 0.995}  # HeteroRL's band


def binomial_tol(p: float, n: int, k: float = 5.0) -> float:
    """k binomial standard deviations of a share estimated from n draws."""
    return k * math.sqrt(p * (1.0 - p) / n)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# --- registry and simple models
@pytest.mark.parametrize(
    ("cfg", "cls"),
    [
        (FixedDelay(seconds=1.0), Fixed),
        (UniformDelay(low=1.0, high=2.0), Uniform),
        (ExponentialDelay(mean=3.0), Exponential),
        (LogNormalDelay(), LogNormal),
        (WeibullDelay(), Weibull),
    ],
)
def test_make_delay_picks_model_by_kind(cfg, cls):
    model = make_delay(cfg)
    assert type(model) is cls
    values = model.sample_many(1000, rng())
    assert values.shape == (1000,)
    assert values.dtype == np.float64
    assert (values >= 0.0).all()


def test_make_delay_unknown_kind_fails():
    with pytest.raises(ValueError, match="unknown delay kind"):
        make_delay(SimpleNamespace(kind="teleport"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "cfg",
    [
        UniformDelay(low=1.0, high=2.0),
        ExponentialDelay(mean=3.0, offset=1.0),
        LogNormalDelay(offset=60.0),
        WeibullDelay(offset=400.0),
    ],
)
def test_sample_loop_equals_sample_many(cfg):
    model = make_delay(cfg)
    r = rng(7)
    looped = [model.sample(r) for _ in range(50)]
    assert np.array_equal(looped, model.sample_many(50, rng(7)))


def test_fixed_returns_constant_and_draws_nothing():
    r = rng(1)
    state = r.bit_generator.state
    model = make_delay(FixedDelay(seconds=12.5))
    assert model.sample(r) == 12.5
    assert (model.sample_many(10, r) == 12.5).all()
    assert r.bit_generator.state == state


def test_uniform_bounds_and_mean():
    low, high = 5.0, 65.0
    x = make_delay(UniformDelay(low=low, high=high)).sample_many(N, rng(2))
    assert x.min() >= low
    assert x.max() <= high
    se = (high - low) / math.sqrt(12.0 * N)
    assert abs(x.mean() - (low + high) / 2.0) < 5.0 * se


def test_exponential_mean_and_floor():
    mean, offset = 30.0, 10.0
    x = make_delay(ExponentialDelay(mean=mean, offset=offset)).sample_many(N, rng(3))
    assert x.min() >= offset
    assert abs(x.mean() - (offset + mean)) < 5.0 * mean / math.sqrt(N)


# --- band-fitted models (HeteroRL)
def test_lognormal_fitted_parameters_by_hand():
    m = make_delay(LogNormalDelay(**HETERO))
    assert isinstance(m, LogNormal)
    z = NormalDist().inv_cdf(1.0 - 0.005 / 2.0)
    assert m.z == pytest.approx(z, abs=1e-12)
    assert m.z == pytest.approx(2.807034, abs=1e-6)
    assert m.mu == pytest.approx(math.log(math.sqrt(60.0 * 1920.0)), abs=1e-12)  # median = geometric mean
    assert m.sigma == pytest.approx(math.log(32.0) / (2.0 * z), abs=1e-12)
    assert m.cdf(60.0) == pytest.approx(0.0025, abs=1e-9)
    assert m.cdf(1920.0) == pytest.approx(0.9975, abs=1e-9)


def test_weibull_fitted_parameters_by_hand():
    m = make_delay(WeibullDelay(**HETERO))
    assert isinstance(m, Weibull)
    p = 0.0025
    k = (math.log(-math.log(p)) - math.log(-math.log(1.0 - p))) / math.log(1920.0 / 60.0)
    assert m.shape == pytest.approx(k, rel=1e-12)
    assert m.shape == pytest.approx(2.244992, abs=1e-6)
    # Both band equations hold: 1 - exp(-(x / lam)^k) = target at each edge.
    assert 1.0 - math.exp(-((60.0 / m.scale) ** m.shape)) == pytest.approx(p, abs=1e-9)
    assert 1.0 - math.exp(-((1920.0 / m.scale) ** m.shape)) == pytest.approx(1.0 - p, abs=1e-9)
    assert m.cdf(60.0) == pytest.approx(p, abs=1e-9)
    assert m.cdf(1920.0) == pytest.approx(1.0 - p, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    lower=st.floats(0.01, 1e3),
    ratio=st.floats(1.01, 1e3),
    conf=st.floats(0.5, 0.9999),
    cls=st.sampled_from([LogNormal, Weibull]),
)
def test_band_fit_hits_both_edges(lower, ratio, conf, cls):
    m = cls(lower, lower * ratio, conf)
    p = (1.0 - conf) / 2.0
    assert m.cdf(m.lower) == pytest.approx(p, abs=1e-9)
    assert m.cdf(m.upper) == pytest.approx(1.0 - p, abs=1e-9)


@pytest.mark.parametrize("cls", [LogNormal, Weibull])
def test_raw_samples_put_the_configured_mass_outside_the_band(cls):
    m: BandDelay = cls(**HETERO)
    t = m.raw_sample_many(N, rng(11))
    p = m.tail
    assert abs((t < m.lower).mean() - p) < binomial_tol(p, N)
    assert abs((t > m.upper).mean() - p) < binomial_tol(p, N)


@pytest.mark.parametrize("cls", [LogNormal, Weibull])
@pytest.mark.parametrize("offset", [0.0, 60.0, 400.0])
def test_clipped_samples_in_band_with_floor_mass_from_the_shift(cls, offset):
    m: BandDelay = cls(**HETERO, offset=offset)
    x = m.sample_many(N, rng(12))
    assert x.min() >= 60.0
    assert x.max() <= 1920.0
    # delay == lower exactly when T - offset <= lower, i.e. with probability F(lower + offset).
    floor_p = m.cdf(m.lower + offset)
    assert abs((x == m.lower).mean() - floor_p) < binomial_tol(floor_p, N) + 1e-12
    ceil_p = 1.0 - m.cdf(m.upper + offset)
    assert abs((x == m.upper).mean() - ceil_p) < binomial_tol(ceil_p, N) + 1e-12


def test_larger_offset_shortens_delays():
    means = [LogNormal(**HETERO, offset=o).sample_many(N, rng(13)).mean() for o in (0.0, 60.0, 400.0)]
    assert means[0] > means[1] > means[2] > 60.0


# --- links and seeding
def hetero_link_cfg(**kw) -> LinkConfig:
    return LinkConfig(
        weights_delay=LogNormalDelay(**HETERO, offset=400.0),
        rollout_delay=ExponentialDelay(mean=2.0, offset=0.5),
        **kw,
    )


def draws(link: Link, n: int = 20) -> tuple[list[float], list[float]]:
    w = [link.weights_transfer_seconds(0) for _ in range(n)]
    r = [link.rollout_transfer_seconds(0) for _ in range(n)]
    return w, r


def test_same_seed_same_delays_and_links_differ_reproducibly():
    cfg = hetero_link_cfg()
    assert draws(Link(cfg, seed=5, index=0)) == draws(Link(cfg, seed=5, index=0))
    assert draws(Link(cfg, seed=5, index=1)) == draws(Link(cfg, seed=5, index=1))
    assert draws(Link(cfg, seed=5, index=0))[0] != draws(Link(cfg, seed=5, index=1))[0]
    assert draws(Link(cfg, seed=5, index=0))[0] != draws(Link(cfg, seed=6, index=0))[0]


def test_streams_are_independent_of_other_paths_and_faults():
    cfg = hetero_link_cfg()
    quiet = Link(cfg, seed=5, index=2)
    expected = [quiet.weights_transfer_seconds(0) for _ in range(20)]
    busy = Link(hetero_link_cfg(weights_faults=FaultConfig(drop=0.5)), seed=5, index=2)
    got = []
    for _ in range(20):  # interleaved rollout traffic and fault draws on the same link
        busy.rollout_transfer_seconds(0)
        busy.faults["weights"].apply(b"x", 0.0)
        got.append(busy.weights_transfer_seconds(0))
    assert got == expected
    # link 2's stream does not depend on links 0 and 1 existing
    assert link_rng(5, 2, "weights", "delay").random() == link_rng(5, 2, "weights", "delay").random()
    assert link_rng(5, 2, "weights", "delay").random() != link_rng(5, 2, "weights", "faults").random()


def test_transfer_time_arithmetic():
    assert bandwidth_seconds(1_000_000, 8.0) == pytest.approx(1.0)  # 1 MB over 8 Mbit/s
    assert bandwidth_seconds(1_000_000, None) == 0.0
    link = Link(LinkConfig(weights_delay=FixedDelay(seconds=2.5), bandwidth_mbps=8.0), seed=0)
    assert link.weights_transfer_seconds(1_000_000) == pytest.approx(3.5)
    assert link.rollout_transfer_seconds(500_000) == pytest.approx(0.5)
    unlimited = Link(LinkConfig(weights_delay=FixedDelay(seconds=2.5)), seed=0)
    assert unlimited.weights_transfer_seconds(10**12) == 2.5


def test_external_rng_overrides_link_stream():
    cfg = LinkConfig(weights_delay=UniformDelay(low=0.0, high=1.0), bandwidth_mbps=8.0)
    link = Link(cfg, seed=0)
    expected = rng(99).uniform(0.0, 1.0) + 1.0
    assert link.weights_transfer_seconds(1_000_000, rng(99)) == pytest.approx(expected)


def test_transmit_applies_delay_then_faults():
    cfg = LinkConfig(rollout_delay=FixedDelay(seconds=3.0), rollout_faults=FaultConfig(duplicate=1.0))
    out = Link(cfg, seed=0).transmit("rollout", b"abcd", sent_at=10.0)
    assert out == [Delivery(13.0, b"abcd"), Delivery(13.0, b"abcd", duplicate=True)]


# --- fault injection
def test_fault_rates_match_configuration():
    cfg = FaultConfig(drop=0.1, duplicate=0.2, reorder=0.3, reorder_seconds=7.0, corrupt=0.25)
    inj = FaultInjector(cfg, rng(21))
    n = 20_000
    payload = bytes(range(16))
    dropped = duplicated = reordered = corrupted = 0
    for _ in range(n):
        out = inj.apply(payload, 100.0)
        if not out:
            dropped += 1
            continue
        duplicated += len(out) == 2
        reordered += out[0].at == 107.0
        corrupted += out[0].payload != payload
        assert all(d.at in (100.0, 107.0) for d in out)
    kept = n - dropped
    assert abs(dropped / n - 0.1) < binomial_tol(0.1, n)
    # the other faults are decided independently, so measure them among delivered messages
    assert abs(duplicated / kept - 0.2) < binomial_tol(0.2, kept)
    assert abs(reordered / kept - 0.3) < binomial_tol(0.3, kept)
    assert abs(corrupted / kept - 0.25) < binomial_tol(0.25, kept)


def test_corruption_flips_exactly_one_byte():
    inj = FaultInjector(FaultConfig(corrupt=1.0), rng(22))
    payload = bytes(64)
    positions = set()
    for _ in range(500):
        (d,) = inj.apply(payload, 0.0)
        assert d.corrupted
        diff = [i for i, (a, b) in enumerate(zip(d.payload, payload, strict=True)) if a != b]
        assert len(diff) == 1
        positions.add(diff[0])
    assert len(positions) > 50  # the position is drawn, not fixed
    assert inj.apply(b"", 0.0) == [Delivery(0.0, b"")]  # nothing to corrupt


def test_duplicates_carry_the_same_bytes():
    inj = FaultInjector(FaultConfig(duplicate=1.0, corrupt=1.0), rng(23))
    a, b = inj.apply(b"payload", 1.0)
    assert a.payload == b.payload != b"payload"
    assert (a.duplicate, b.duplicate) == (False, True)


def test_zero_probabilities_never_alter():
    inj = FaultInjector(FaultConfig(reorder_seconds=99.0), rng(24))
    assert not inj.active
    for i in range(2000):
        payload = i.to_bytes(4, "little")
        assert inj.apply(payload, float(i)) == [Delivery(float(i), payload)]


def test_certain_faults_and_determinism():
    assert FaultInjector(FaultConfig(drop=1.0), rng(25)).apply(b"abc", 1.0) == []
    (late,) = FaultInjector(FaultConfig(reorder=1.0, reorder_seconds=30.0), rng(25)).apply(b"abc", 1.0)
    assert late == Delivery(31.0, b"abc", reordered=True)
    cfg = FaultConfig(drop=0.2, duplicate=0.2, reorder=0.2, corrupt=0.2)
    a, b = FaultInjector(cfg, rng(26)), FaultInjector(cfg, rng(26))
    assert [a.apply(b"hello", float(i)) for i in range(300)] == [b.apply(b"hello", float(i)) for i in range(300)]


def test_raising_one_fault_keeps_the_others_fates():
    base = FaultConfig(corrupt=0.3)
    more = FaultConfig(corrupt=0.3, reorder=0.5)
    a, b = FaultInjector(base, rng(27)), FaultInjector(more, rng(27))
    for _ in range(500):
        (x,) = a.apply(b"0123456789", 0.0)
        (y,) = b.apply(b"0123456789", 0.0)
        assert x.payload == y.payload


def test_flip_byte():
    assert flip_byte(b"\x00\x01\x02", 1, 0xFF) == b"\x00\xfe\x02"
    with pytest.raises(AssertionError):
        flip_byte(b"\x00", 0, 0)
