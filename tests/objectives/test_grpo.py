"""GRPO by hand: per-token ratio, asymmetric clip, the three aggregations."""

import math

import pytest

from heterorl.objectives import make_objective

from ._helpers import assert_close, run

E = math.exp
# log ratios: seq 0 = [0.4, -0.3, 0.0] (A = 1), seq 1 = [0.3, -0.4, pad] (A = -0.5); eps_low 0.2, eps_high 0.28
LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, 9.0]]
BEHAVIOR = [[-1.4, -0.2, -2.0], [-0.6, -0.8, -7.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.0, -0.5]

# Per token: (loss, d loss / d logp before aggregation).
TOKENS = [
    [
        (-1.28, 0.0),  # rho = e^0.4 = 1.49 > 1.28 with A > 0: clipped, no gradient
        (-E(-0.3), -E(-0.3)),  # rho = 0.74 < 0.8 but A > 0: the low clip is inactive
        (-1.0, -1.0),  # rho = 1
    ],
    [
        (0.5 * E(0.3), 0.5 * E(0.3)),  # rho = 1.35 > 1.28 with A < 0: the unclipped side, gradient -A rho
        (0.4, 0.0),  # rho = 0.67 < 0.8 with A < 0: clipped at 0.8 * 0.5
    ],
]


def expected(mode: str) -> tuple[float, list[list[float]]]:
    if mode == "seq_mean_token_mean":
        scales = [[1 / (3 * 2)] * 3, [1 / (2 * 2)] * 2]
    elif mode == "token_mean":
        scales = [[1 / 5] * 3, [1 / 5] * 2]
    else:  # dr_grpo: B * T = 2 * 3
        scales = [[1 / 6] * 3, [1 / 6] * 2]
    loss = sum(tok * s for seq, sc in zip(TOKENS, scales, strict=True) for (tok, _), s in zip(seq, sc, strict=True))
    grad = [[g * s for (_, g), s in zip(seq, sc, strict=True)] for seq, sc in zip(TOKENS, scales, strict=True)]
    grad[1].append(0.0)  # padding
    return loss, grad


@pytest.mark.parametrize("mode", ["seq_mean_token_mean", "token_mean", "dr_grpo"])
def test_grpo_by_hand(mode: str):
    res = run(make_objective("grpo", eps_low=0.2, eps_high=0.28, aggregation=mode), LOGP, BEHAVIOR, MASK, ADV)
    loss, grad = expected(mode)
    assert_close(res.loss, loss)
    assert_close(res.grad, grad)


def test_grpo_stats_by_hand():
    res = run(make_objective("grpo", eps_low=0.2, eps_high=0.28), LOGP, BEHAVIOR, MASK, ADV)
    log_r = [0.4, -0.3, 0.0, 0.3, -0.4]
    r = [E(x) for x in log_r]
    mean = sum(r) / 5
    s = res.stats
    assert s["clip_frac"] == pytest.approx(2 / 5)
    assert s["clip_frac_high"] == pytest.approx(1 / 5)
    assert s["clip_frac_low"] == pytest.approx(1 / 5)
    assert s["is_weight_mean"] == pytest.approx(mean)
    assert s["is_weight_var"] == pytest.approx(sum((x - mean) ** 2 for x in r) / 5)
    assert s["is_weight_max"] == pytest.approx(E(0.4))
    assert s["ess"] == pytest.approx(sum(r) ** 2 / (5 * sum(x * x for x in r)))
    assert s["kl_k3"] == pytest.approx(sum(x - 1 - math.log(x) for x in r) / 5)
    assert s["kl_k1"] == pytest.approx(-sum(log_r) / 5, abs=1e-12)
    assert s["entropy_proxy"] == pytest.approx((1.0 + 0.5 + 2.0 + 0.3 + 1.2) / 5)
    assert s["advantage_abs_mean"] == pytest.approx(0.75)
    assert s["loss"] == pytest.approx(res.loss)


def test_dual_clip_by_hand():
    # A < 0 with rho = 4 > c = 3: loss capped at c |A| = 1.5, no gradient; rho = 2 < c: the unclipped side -A rho;
    # A > 0 with rho = 4: the ordinary clip (1 + eps) A. eps 0.2, c = 3, seq_mean_token_mean.
    logp = [[math.log(4.0), math.log(2.0)], [math.log(4.0), 0.0]]
    behavior = [[0.0, 0.0], [0.0, 0.0]]
    res = run(make_objective("grpo", dual_clip=3.0), logp, behavior, [[1, 1], [1, 0]], [-0.5, 1.0])
    assert_close(res.loss, ((1.5 + 1.0) / 2 + (-1.2)) / 2)
    assert_close(res.grad, [[0.0, 0.5 * 2.0 / 2 / 2], [0.0, 0.0]])
    assert res.stats["dual_clip_frac"] == pytest.approx(1 / 3)
    plain = run(make_objective("grpo"), logp, behavior, [[1, 1], [1, 0]], [-0.5, 1.0])
    assert plain.grad[0][0] == pytest.approx(0.5 * 4.0 / 2 / 2)  # without it the stale token dominates
    assert "dual_clip_frac" not in plain.stats


def test_dual_clip_must_exceed_one():
    with pytest.raises(ValueError, match="dual_clip"):
        make_objective("grpo", dual_clip=1.0)
