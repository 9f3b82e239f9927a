"""Aggregation modes, diagnostics and the clipped surrogate, hand-checked."""

import math

import pytest
import torch

from heterorl.objectives import aggregate
from heterorl.objectives.diagnostics import k3, log_weight_stats
from heterorl.objectives.groups import group_logsumexp
from heterorl.objectives.ratios import clip_fractions, clipped_surrogate

NAN = math.nan
# 2 sequences x 4 positions; the second has 1 completion token; off-mask entries are garbage.
X = [[1.0, 2.0, 3.0, NAN], [math.inf, 6.0, -50.0, NAN]]
MASK = [[1, 1, 1, 0], [0, 1, 0, 0]]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("seq_mean_token_mean", ((1 + 2 + 3) / 3 + 6 / 1) / 2),
        ("token_mean", (1 + 2 + 3 + 6) / 4),
        ("dr_grpo", (1 + 2 + 3 + 6) / (2 * 4)),
    ],
)
def test_aggregation_modes_by_hand(mode: str, expected: float):
    x = torch.tensor(X, dtype=torch.float64, requires_grad=True)
    value = aggregate(x, torch.tensor(MASK, dtype=torch.bool), mode)  # type: ignore[arg-type]
    assert value.item() == pytest.approx(expected)
    (grad,) = torch.autograd.grad(value, x)
    assert torch.isfinite(grad).all()
    assert (grad[~torch.tensor(MASK, dtype=torch.bool)] == 0).all()


def test_unknown_aggregation():
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), "sum")  # type: ignore[arg-type]


def test_k3_by_hand():
    r = torch.tensor([0.5, 1.0, 3.0], dtype=torch.float64)
    expected = torch.tensor([0.5 - 1 - math.log(0.5), 0.0, 3 - 1 - math.log(3)], dtype=torch.float64)
    torch.testing.assert_close(k3(r.log()), expected)


def test_log_weight_stats_by_hand():
    # weights 1, 2, 4 (and one invalid entry with a huge weight that must be ignored)
    log_w = torch.tensor([0.0, math.log(2), math.log(4), 80.0])
    valid = torch.tensor([True, True, True, False])
    stats = log_weight_stats(log_w, valid)
    mean = 7 / 3
    assert stats["is_weight_mean"].item() == pytest.approx(mean)
    assert stats["is_weight_var"].item() == pytest.approx(((1 - mean) ** 2 + (2 - mean) ** 2 + (4 - mean) ** 2) / 3)
    assert stats["is_weight_max"].item() == pytest.approx(4.0)
    assert stats["ess"].item() == pytest.approx(7**2 / (3 * (1 + 4 + 16)))


def test_ess_is_exact_for_huge_weights():
    stats = log_weight_stats(torch.tensor([300.0, 300.0]), torch.tensor([True, True]))
    assert stats["ess"].item() == pytest.approx(1.0)


def test_clipped_surrogate_and_fractions_by_hand():
    ratio = torch.tensor([1.5, 0.5, 1.5, 0.5, 1.0], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0], dtype=torch.float64)
    # A>0: min(r, clip(r)) -> 1.2 (clipped), 0.5 (not); A<0: min(-r, -clip(r)) -> -1.5 (not), -0.8 (clipped)
    expected = [-1.2, -0.5, 1.5, 0.8, -2.0]
    torch.testing.assert_close(clipped_surrogate(ratio, adv, 0.2, 0.2), torch.tensor(expected, dtype=torch.float64))
    fr = clip_fractions(ratio, adv, 0.2, 0.2, torch.ones(5, dtype=torch.bool))
    assert fr["clip_frac_high"].item() == pytest.approx(1 / 5)
    assert fr["clip_frac_low"].item() == pytest.approx(1 / 5)
    assert fr["clip_frac"].item() == pytest.approx(2 / 5)


def test_group_logsumexp_by_hand():
    x = torch.tensor([0.0, 1000.0, math.log(2), 999.0, -math.inf], dtype=torch.float64)
    ids = torch.tensor([0, 1, 0, 1, 2])
    expected = [math.log(1 + 2), 1000 + math.log(1 + math.exp(-1)), -math.inf]
    torch.testing.assert_close(group_logsumexp(x, ids, 3), torch.tensor(expected, dtype=torch.float64))


def test_weight_stats_saturate_instead_of_nan():
    # two sequences with exact log ratios 1000 and 0: the mean is e^700 / 2 (saturated), the variance inf
    stats = log_weight_stats(torch.tensor([1000.0, 0.0]), torch.tensor([True, True]))
    assert stats["is_weight_mean"].item() == pytest.approx(math.exp(700) / 2)
    assert stats["is_weight_var"].item() == math.inf
    assert stats["ess"].item() == pytest.approx(0.5)  # exact: one weight dominates
