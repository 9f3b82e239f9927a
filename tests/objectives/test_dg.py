"""Delightful PG: hand-checked loss and gradient, the gate's properties, independence from behaviour log-probs."""

import math

import pytest
import torch

from heterorl.objectives import make_objective
from heterorl.objectives.dg import delight_gate

from ._helpers import assert_close, run


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


LOGP = [[-0.1, -2.0], [-3.0, 4.0]]
BEHAVIOR = [[-0.5, -0.5], [-0.5, 0.0]]
MASK = [[1, 1], [1, 0]]
ADV = [0.5, -0.5]
# delight chi = A * surprisal: 0.5 * 0.1, 0.5 * 2.0, -0.5 * 3.0
CHI = [0.05, 1.0, -1.5]


def expected(gates: list[float]) -> tuple[float, list[list[float]]]:
    w00, w01, w10 = gates
    # per token -w A logp; seq_mean_token_mean over (2 tokens, 1 token), then / B = 2
    loss = ((-w00 * 0.5 * -0.1 - w01 * 0.5 * -2.0) / 2 + (-w10 * -0.5 * -3.0)) / 2
    grad = [[-w00 * 0.5 / 4, -w01 * 0.5 / 4], [w10 * 0.5 / 2, 0.0]]
    return loss, grad


@pytest.mark.parametrize(("eta", "lam"), [(1.0, 0.0), (0.5, 0.2)])
def test_dg_by_hand(eta: float, lam: float):
    res = run(make_objective("dg", eta=eta, lam=lam), LOGP, BEHAVIOR, MASK, ADV)
    gates = [sigmoid((c - lam) / eta) for c in CHI]
    loss, grad = expected(gates)
    assert_close(res.loss, loss)
    assert_close(res.grad, grad)
    assert res.stats["gate_mean"] == pytest.approx(sum(gates) / 3)


def test_hard_gate_at_eta_zero():
    res = run(make_objective("dg", eta=0.0), LOGP, BEHAVIOR, MASK, ADV)
    loss, grad = expected([1.0, 1.0, 0.0])  # chi > 0, chi > 0, chi < 0
    assert_close(res.loss, loss)
    assert_close(res.grad, grad)
    assert res.stats["gate_frac_above_0.9"] == pytest.approx(2 / 3)
    assert res.stats["gate_frac_below_0.1"] == pytest.approx(1 / 3)
    chi = torch.tensor([-1.0, 0.0, 0.3, 1.0])
    assert delight_gate(chi, eta=0.0, lam=0.3).tolist() == [0.0, 0.0, 0.0, 1.0]  # strict: chi > lam


def test_dg_ignores_behavior_logp():
    obj = make_objective("dg")
    base = run(obj, LOGP, BEHAVIOR, MASK, ADV)
    for behavior in ([[-60.0, 40.0], [-0.001, 3.0]], [[0.0, 0.0], [0.0, 0.0]], LOGP):
        other = run(obj, LOGP, behavior, MASK, ADV)
        assert other.loss == base.loss
        assert other.grad == base.grad
        assert other.stats["gate_mean"] == base.stats["gate_mean"]


def gate_from_grad(logp: float, adv: float, eta: float) -> float:
    """One token, one sequence: d loss / d logp = -w A, so the gate is read off the gradient."""
    res = run(make_objective("dg", eta=eta), [[logp]], [[logp]], [[1]], [adv])
    return res.grad[0][0] / -adv


@pytest.mark.parametrize("eta", [0.5, 1.0, 2.0])
def test_gate_is_one_half_at_zero_advantage_or_zero_surprisal(eta: float):
    chi = torch.tensor([0.0 * 7.0, 3.0 * 0.0])  # A = 0 with surprisal 7; A = 3 with surprisal 0
    torch.testing.assert_close(delight_gate(chi, eta=eta, lam=0.0), torch.tensor([0.5, 0.5]))
    assert gate_from_grad(logp=0.0, adv=3.0, eta=eta) == pytest.approx(0.5)
    res = run(make_objective("dg", eta=eta), [[-7.0]], [[-7.0]], [[1]], [0.0])
    assert res.stats["gate_mean"] == pytest.approx(0.5)


def test_rare_failures_are_suppressed_and_rare_successes_kept():
    assert gate_from_grad(logp=-25.0, adv=-1.0, eta=1.0) < 1e-10  # rare failure: chi = -25
    assert gate_from_grad(logp=-25.0, adv=1.0, eta=1.0) > 1 - 1e-10  # rare success: chi = 25
    assert 0 < gate_from_grad(logp=-0.01, adv=-1.0, eta=1.0) < 0.5  # common failure: mildly down-weighted


@pytest.mark.parametrize("eta", [0.25, 0.5, 1.0, 3.0])
@pytest.mark.parametrize("pi", [1e-6, 0.01, 0.3, 0.9, 0.999])
def test_binary_reward_failure_gate_bound(eta: float, pi: float):
    """Binary reward, A = -1/2 on failure: w = sigmoid(log(pi) / (2 eta)) <= pi^(1/(2 eta))."""
    w = gate_from_grad(logp=math.log(pi), adv=-0.5, eta=eta)
    assert 0 < w <= pi ** (1 / (2 * eta))
