"""Empirical delays, outages, path conditions and the simple transfer model: hand-computed numbers."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from heterorl.config import EmpiricalDelay, FixedDelay, LinkConfig, Outage
from heterorl.network import Empirical, Link, Outages, make_delay
from heterorl.transport.simulated.paths import SimPath


# --- empirical delays
def test_empirical_from_samples_interpolates_between_sorted_samples() -> None:
    model = Empirical.from_samples([0.1, 0.3, 0.2])  # points (0, 0.1), (0.5, 0.2), (1, 0.3)
    assert model.quantile(np.array([0.0, 0.25, 0.5, 0.9, 1.0])) == pytest.approx([0.1, 0.15, 0.2, 0.28, 0.3])


def test_empirical_from_quantiles_holds_the_end_values_beyond_them() -> None:
    model = make_delay(EmpiricalDelay(quantiles={0.9: 2.0, 0.5: 1.0}))
    assert isinstance(model, Empirical)
    assert model.quantile(np.array([0.2, 0.5, 0.7, 0.9, 0.95])) == pytest.approx([1.0, 1.0, 1.5, 2.0, 2.0])


def test_empirical_draws_are_the_inverse_cdf_of_the_same_uniforms() -> None:
    model = Empirical.from_quantiles({0.0: 0.05, 0.5: 0.1, 1.0: 0.5})
    u = np.random.default_rng(3).random(1000)
    draws = model.sample_many(1000, np.random.default_rng(3))
    assert draws == pytest.approx(np.interp(u, [0.0, 0.5, 1.0], [0.05, 0.1, 0.5]))
    one_by_one = [model.sample(gen) for gen in [np.random.default_rng(3)] for _ in range(5)]
    assert one_by_one == pytest.approx(draws[:5])


def test_empirical_reproduces_the_quantiles_of_its_samples() -> None:
    samples = np.random.default_rng(0).lognormal(-2.0, 0.5, size=2000)
    draws = make_delay(EmpiricalDelay(samples=samples.tolist())).sample_many(200_000, np.random.default_rng(1))
    probs = [0.1, 0.5, 0.9, 0.99]
    assert np.quantile(draws, probs) == pytest.approx(np.quantile(samples, probs), rel=0.02)
    assert draws.min() >= samples.min()
    assert draws.max() <= samples.max()


def test_one_sample_is_a_fixed_delay() -> None:
    assert make_delay(EmpiricalDelay(samples=[0.25])).sample_many(3, np.random.default_rng(0)) == pytest.approx(
        [0.25] * 3
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one"),
        ({"samples": [0.1], "quantiles": {0.5: 0.1}}, "exactly one"),
        ({"quantiles": {0.5: 0.2, 0.9: 0.1}}, "must not decrease"),
        ({"quantiles": {1.5: 0.2}}, "less than or equal to 1"),
        ({"samples": [-0.1]}, "greater than or equal to 0"),
    ],
)
def test_empirical_config_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        EmpiricalDelay(**kwargs)


# --- outages
def test_outages_merge_and_answer_where_the_link_is_down() -> None:
    cuts = Outages([(5.0, 6.0), (1.0, 2.0), (1.5, 3.0)])
    assert cuts.windows == [(1.0, 3.0), (5.0, 6.0)]
    assert [cuts.down(t) for t in (0.5, 1.0, 2.9, 3.0, 5.5, 6.0)] == [False, True, True, False, True, False]
    assert [cuts.next_up(t) for t in (0.5, 1.0, 5.2)] == [0.5, 3.0, 6.0]
    assert cuts.first_cut(0.0, 0.9) is None
    assert cuts.first_cut(0.0, 1.0) == (1.0, 3.0)
    assert cuts.first_cut(2.0, 2.1) == (1.0, 3.0)
    assert cuts.first_cut(3.0, 4.9) is None
    assert cuts.first_cut(3.0, 10.0) == (5.0, 6.0)
    assert not Outages()


def test_outage_config_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match="must be < end"):
        Outage(start=2.0, end=2.0)
    with pytest.raises(ValidationError, match="time order"):
        LinkConfig(outages=[{"start": 5, "end": 7}, {"start": 6, "end": 8}])


# --- the link's directions
def test_per_direction_rates_fall_back_to_bandwidth_mbps() -> None:
    cfg = LinkConfig(bandwidth_mbps=10.0, rollout_bandwidth_mbps=2.0)
    assert (cfg.bandwidth_of("weights"), cfg.bandwidth_of("rollout")) == (10.0, 2.0)
    link = Link(cfg, seed=0)
    assert link.conditions["rollout"].rate_bps(0.0) == 2e6
    assert link.transfer_seconds("rollout", 1000) == pytest.approx(1000 * 8 / 2e6)


def test_blocked_draws_are_the_same_delays() -> None:
    cfg = LinkConfig(weights_delay={"kind": "lognormal", "lower": 0.05, "upper": 2.0})
    one, blocked = Link(cfg, seed=4).conditions["weights"], Link(cfg, seed=4, block=64).conditions["weights"]
    assert [blocked.delay(0.0) for _ in range(100)] == [one.delay(0.0) for _ in range(100)]


# --- the simple transfer model
def test_a_size_settled_after_sending_gives_the_arrival_of_the_simple_transfer_model() -> None:
    """The simulated path's split (`draw_delay` when sent, `arrive` once the size is known) is the simple model."""
    cfg = LinkConfig(weights_delay={"kind": "uniform", "low": 0.1, "high": 2.0}, bandwidth_mbps=4.0)
    path = SimPath(Link(cfg, seed=7), "weights")
    assert path.deferrable
    link = Link(cfg, seed=7)
    sizes = np.random.default_rng(0).integers(0, 2_000_000, size=50)
    times = np.cumsum(np.random.default_rng(1).exponential(1.0, size=50))
    for now, nbytes in zip(times, sizes, strict=True):
        delay = path.draw_delay()
        expected = link.transfer("weights", float(now), int(nbytes)).arrival
        assert path.arrive(float(now), int(nbytes), delay) == expected
    tcp = LinkConfig(weights_delay={"kind": "fixed", "seconds": 0.1}, transfer={"model": "tcp"})
    assert not SimPath(Link(tcp, seed=0), "weights").deferrable


def test_simple_transfer_sends_again_after_a_cut() -> None:
    cfg = LinkConfig(weights_delay=FixedDelay(seconds=0.5), bandwidth_mbps=8.0, outages=[{"start": 1.2, "end": 2.0}])
    link = Link(cfg, seed=0)
    # 1 MB at 8 Mbit/s = 1 s: sent 0 -> 1.0, would arrive 1.5, but the cut at 1.2 loses it; sent again at 2.0
    first = link.transfer("weights", 0.0, 1_000_000)
    assert (first.start, first.sent, first.arrival, first.retransmissions) == pytest.approx((0.0, 3.0, 3.5, 1))
    # sent during a cut: it waits for the link
    second = link.transfer("weights", 5.0, 0)
    assert second.arrival == pytest.approx(5.5)
    held = Link(cfg, seed=0).transfer("weights", 1.5, 0)
    assert (held.start, held.arrival) == pytest.approx((2.0, 2.5))
