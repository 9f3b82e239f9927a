"""GSPO by hand, and GSPO == GRPO run with the sequence ratio on every token."""

import math

import pytest
import torch

from heterorl.objectives import make_objective

from ._helpers import assert_close, run
from .test_grpo import ADV, BEHAVIOR, LOGP, MASK

# mean log ratio: seq 0 = (0.4 - 0.3 + 0) / 3 = 1/30 (A = 1), seq 1 = (0.3 - 0.4) / 2 = -0.05 (A = -0.5)
S0, S1 = math.exp(1 / 30), math.exp(-0.05)


def test_gspo_unclipped_by_hand():
    res = run(make_objective("gspo", eps_low=0.1, eps_high=0.1), LOGP, BEHAVIOR, MASK, ADV)
    assert_close(res.loss, (-S0 + 0.5 * S1) / 2)
    # d/dlogp_t of -A s_i = -A s_i / n_i, then / B
    assert_close(res.grad, [[-S0 / 3 / 2] * 3, [0.5 * S1 / 2 / 2] * 2 + [0.0]])
    assert res.stats["clip_frac"] == 0.0
    assert res.stats["is_weight_mean"] == pytest.approx((S0 + S1) / 2)
    assert res.stats["ess"] == pytest.approx((S0 + S1) ** 2 / (2 * (S0**2 + S1**2)))


def test_gspo_clipped_by_hand():
    # s0 = 1.034 > 1.02 with A > 0 and s1 = 0.951 < 0.98 with A < 0: both clipped, no gradient
    res = run(make_objective("gspo", eps_low=0.02, eps_high=0.02), LOGP, BEHAVIOR, MASK, ADV)
    assert_close(res.loss, (-1.02 + 0.98 * 0.5) / 2)
    assert_close(res.grad, [[0.0] * 3] * 2)
    assert res.stats["clip_frac"] == 1.0
    assert res.stats["clip_frac_low"] == 0.5
    assert res.stats["clip_frac_high"] == 0.5


def test_gspo_default_clip_range_is_the_papers():
    cfg = make_objective("gspo").config
    assert (cfg.eps_low, cfg.eps_high) == (3e-4, 4e-4)  # type: ignore[attr-defined]


@pytest.mark.parametrize("eps", [0.02, 0.04, 0.2])
def test_gspo_equals_grpo_with_sequence_ratio(eps: float):
    """GRPO whose behaviour log-probs make every token's ratio equal to s_i is GSPO, loss and gradient."""
    torch.manual_seed(0)
    B, T = 6, 5
    logp = -torch.rand(B, T, dtype=torch.float64) * 3
    behavior = logp + 0.1 * torch.randn(B, T, dtype=torch.float64)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = False
    mask[4, 1:] = False
    adv = torch.randn(B, dtype=torch.float64)
    n = mask.sum(-1)
    log_s = torch.stack([(logp[i, : n[i]] - behavior[i, : n[i]]).mean() for i in range(B)])  # plain per-row mean
    behavior_seq = logp - log_s[:, None]  # logp_t - behavior_seq_t = log s_i on every token
    args = {"mask": mask, "advantages": adv, "group_index": torch.arange(B)}

    lp1 = logp.clone().requires_grad_()
    gspo = make_objective("gspo", eps_low=eps, eps_high=eps)(logp=lp1, behavior_logp=behavior, **args)
    lp2 = logp.clone().requires_grad_()
    grpo = make_objective("grpo", eps_low=eps, eps_high=eps, aggregation="seq_mean_token_mean")(
        logp=lp2, behavior_logp=behavior_seq, **args
    )
    torch.testing.assert_close(gspo.loss, grpo.loss)
    torch.testing.assert_close(torch.autograd.grad(gspo.loss, lp1)[0], torch.autograd.grad(grpo.loss, lp2)[0])
