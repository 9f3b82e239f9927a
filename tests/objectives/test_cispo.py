"""CISPO by hand: the clipped, stop-gradient weight scales every token's gradient and never zeroes it."""

import math

import pytest

from heterorl.objectives import make_objective

from ._helpers import assert_close, run
from .test_grpo import ADV, BEHAVIOR, LOGP, MASK

E = math.exp
# log ratios: seq 0 = [0.4, -0.3, 0.0] (A = 1), seq 1 = [0.3, -0.4, pad] (A = -0.5)
LOG_R = [[0.4, -0.3, 0.0], [0.3, -0.4]]


def by_hand(lo: float, hi: float) -> tuple[float, list[list[float]]]:
    """token_mean over 5 tokens of -w_t A_i logp_t with w = clip(r, lo, hi) a constant: gradient -w_t A_i / 5."""
    w = [[min(max(E(x), lo), hi) for x in row] for row in LOG_R]
    loss = sum(-wt * a * lp for ws, a, lps in zip(w, ADV, LOGP, strict=False) for wt, lp in zip(ws, lps, strict=False))
    grad = [[-wt * a / 5 for wt in ws] for ws, a in zip(w, ADV, strict=True)]
    grad[1].append(0.0)
    return loss / 5, grad


def test_cispo_defaults_by_hand():
    obj = make_objective("cispo")
    assert (obj.config.eps_low, obj.config.eps_high, obj.config.aggregation) == (1.0, 3.0, "token_mean")  # type: ignore[attr-defined]
    res = run(obj, LOGP, BEHAVIOR, MASK, ADV)
    loss, grad = by_hand(0.0, 4.0)  # nothing clipped: the plain token ratio
    assert_close(res.loss, loss)
    assert_close(res.grad, grad)
    assert res.stats["clip_frac"] == 0.0
    r = [E(x) for row in LOG_R for x in row]
    assert res.stats["is_weight_mean"] == pytest.approx(sum(r) / 5)


def test_cispo_clipped_tokens_keep_their_gradient():
    # bounds [0.8, 1.28]: r = 1.49 (A > 0) and 1.35 (A < 0) -> 1.28; r = 0.74 (A > 0) and 0.67 (A < 0) -> 0.8
    res = run(make_objective("cispo", eps_low=0.2, eps_high=0.28), LOGP, BEHAVIOR, MASK, ADV)
    loss, grad = by_hand(0.8, 1.28)
    assert_close(res.loss, loss)
    assert_close(res.grad, grad)
    assert res.grad[0][0] == pytest.approx(-1.28 / 5)  # GRPO zeroes this token (r > 1 + eps_high with A > 0)
    grpo = run(make_objective("grpo", eps_low=0.2, eps_high=0.28, aggregation="token_mean"), LOGP, BEHAVIOR, MASK, ADV)
    assert grpo.grad[0][0] == 0.0
    s = res.stats  # clip fractions count clipped weights whatever the advantage's sign
    assert (s["clip_frac_high"], s["clip_frac_low"], s["clip_frac"]) == pytest.approx((2 / 5, 2 / 5, 4 / 5))


def test_cispo_seq_mean_aggregation():
    res = run(make_objective("cispo", aggregation="seq_mean_token_mean"), LOGP, BEHAVIOR, MASK, ADV)
    w = [[E(x) for x in row] for row in LOG_R]
    assert_close(res.grad, [[-x / 3 / 2 for x in w[0]], [0.5 * x / 2 / 2 for x in w[1]] + [0.0]])
