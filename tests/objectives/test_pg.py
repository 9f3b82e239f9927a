"""REINFORCE and truncated sequence-level IS by hand."""

import math

import pytest

from heterorl.objectives import make_objective

from ._helpers import assert_close, run

LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, 9.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.0, -0.5]


def test_pg_by_hand():
    res = run(make_objective("pg"), LOGP, [[0.0] * 3] * 2, MASK, ADV)
    assert_close(res.loss, (-1.0 * (-3.5 / 3) + 0.5 * (-1.5 / 2)) / 2)
    assert_close(res.grad, [[-1.0 / 3 / 2] * 3, [0.5 / 2 / 2] * 2 + [0.0]])
    # no weights of its own: the stats describe the token ratio p/q
    r = [math.exp(x) for x in (-1.0, -0.5, -2.0, -0.3, -1.2)]
    assert res.stats["is_weight_mean"] == pytest.approx(sum(r) / 5)


def test_pg_token_mean_and_dr_grpo_by_hand():
    res = run(make_objective("pg", aggregation="token_mean"), LOGP, LOGP, MASK, ADV)
    assert_close(res.loss, (3.5 - 0.5 * 1.5) / 5)
    assert_close(res.grad, [[-1 / 5] * 3, [0.5 / 5] * 2 + [0.0]])
    res = run(make_objective("pg", aggregation="dr_grpo"), LOGP, LOGP, MASK, ADV)
    assert_close(res.grad, [[-1 / 6] * 3, [0.5 / 6] * 2 + [0.0]])


def test_is_pg_by_hand():
    # sequence log-ratios: seq 0 sums to 3 (w = e^3 = 20.1, truncated to 10), seq 1 to -0.5 (w = e^-0.5)
    behavior = [[-2.0, -1.5, -3.0], [-0.05, -0.95, 0.0]]
    res = run(make_objective("is_pg"), LOGP, behavior, MASK, ADV)
    w1 = math.exp(-0.5)
    assert_close(res.loss, (-10 * 1.0 * (-3.5 / 3) - w1 * -0.5 * (-1.5 / 2)) / 2)
    assert_close(res.grad, [[-10 / 3 / 2] * 3, [w1 * 0.5 / 2 / 2] * 2 + [0.0]])
    s = res.stats
    assert s["clip_frac"] == pytest.approx(0.5)
    assert s["clip_frac_high"] == pytest.approx(0.5)
    assert s["clip_frac_low"] == 0.0
    assert s["is_weight_mean"] == pytest.approx((math.exp(3) + w1) / 2)  # before truncation
    assert s["is_weight_max"] == pytest.approx(math.exp(3))
