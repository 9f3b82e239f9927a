"""KL penalty to the frozen reference model: the k1 / k2 / k3 estimators and their gradients by hand, with the
objective's own aggregation."""

import math

import pytest

from heterorl.objectives import make_objective

from ._helpers import assert_close, run

E = math.exp
LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, 9.0]]
REF = [[-1.2, -0.5, -1.5], [-0.3, -1.0, math.nan]]  # garbage on the padding
MASK = [[1, 1, 1], [1, 1, 0]]
D = [[-0.2, 0.0, 0.5], [0.0, 0.2]]  # d = ref_logp - logp on the completion tokens
ZERO_ADV = [0.0, 0.0]  # the policy term is 0 with zero gradient: what remains is the penalty
# per token: (estimator value, its derivative with respect to logp)
ESTIMATORS = {
    "k1": lambda d: (-d, 1.0),
    "k2": lambda d: (d * d / 2, -d),
    "k3": lambda d: (E(d) - d - 1, 1 - E(d)),
}


def by_hand(estimator: str, aggregation: str, beta: float) -> tuple[float, list[list[float]]]:
    f = ESTIMATORS[estimator]
    scale = [[1 / 3 / 2] * 3, [1 / 2 / 2] * 2] if aggregation == "seq_mean_token_mean" else [[1 / 5] * 3, [1 / 5] * 2]
    value = sum(f(d)[0] * s for ds, ss in zip(D, scale, strict=True) for d, s in zip(ds, ss, strict=True))
    grad = [[beta * f(d)[1] * s for d, s in zip(ds, ss, strict=True)] for ds, ss in zip(D, scale, strict=True)]
    grad[1].append(0.0)
    return value, grad


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean"])
def test_penalty_by_hand(estimator: str, aggregation: str):
    beta = 0.04
    obj = make_objective("pg", ref_kl_beta=beta, ref_kl_estimator=estimator, aggregation=aggregation)
    assert obj.needs_ref_logp
    res = run(obj, LOGP, LOGP, MASK, ZERO_ADV, ref_logp=REF)
    value, grad = by_hand(estimator, aggregation, beta)
    assert_close(res.loss, beta * value)
    assert_close(res.grad, grad)
    assert res.stats["kl_ref"] == pytest.approx(value, abs=1e-12)
    assert res.stats["loss"] == pytest.approx(beta * value, abs=1e-12)


@pytest.mark.parametrize("name", ["gspo", "gepo"])
def test_sequence_objectives_use_the_per_sequence_mean(name: str):
    res = run(make_objective(name, ref_kl_beta=0.1), LOGP, LOGP, MASK, ZERO_ADV, ref_logp=REF)
    value, grad = by_hand("k3", "seq_mean_token_mean", 0.1)
    assert_close(res.loss, 0.1 * value)
    assert_close(res.grad, grad)


def test_penalty_adds_to_the_policy_loss():
    adv = [1.0, -0.5]
    base = run(make_objective("grpo"), LOGP, LOGP, MASK, adv)
    res = run(make_objective("grpo", ref_kl_beta=0.1), LOGP, LOGP, MASK, adv, ref_logp=REF)
    value, grad = by_hand("k3", "seq_mean_token_mean", 0.1)
    assert_close(res.loss, base.loss + 0.1 * value)
    expected = [[b + g for b, g in zip(rb, rg, strict=True)] for rb, rg in zip(base.grad, grad, strict=True)]
    assert_close(res.grad, expected)


def test_zero_at_the_reference():
    res = run(make_objective("pg", ref_kl_beta=1.0), LOGP, LOGP, MASK, ZERO_ADV, ref_logp=LOGP)
    assert res.stats["kl_ref"] == 0.0
    assert_close(res.grad, [[0.0] * 3] * 2)  # k3's gradient vanishes at pi = pi_ref


def test_off_by_default_and_required_when_on():
    obj = make_objective("grpo")
    assert not obj.needs_ref_logp
    res = run(obj, LOGP, LOGP, MASK, [1.0, -0.5], ref_logp=[[math.inf] * 3] * 2)  # ignored at beta = 0
    assert "kl_ref" not in res.stats
    assert math.isfinite(res.loss)
    with pytest.raises(ValueError, match="ref_logp"):
        run(make_objective("grpo", ref_kl_beta=0.01), LOGP, LOGP, MASK, [1.0, -0.5])
    with pytest.raises(ValueError, match="ref_kl_estimator"):
        make_objective("grpo", ref_kl_estimator="k4")
