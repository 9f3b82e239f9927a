"""Decoupled PPO by hand: proximal clip, behaviour weight, cap by mask (original denominator) or clamp."""

import math

import pytest
import torch

from heterorl.objectives import make_objective

from ._helpers import assert_close, run

E = math.exp
LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, 7.0]]
PROX = [[-1.1, -0.5, -2.1], [-0.3, -1.6, 0.0]]
BEHAVIOR = [[-1.3, -1.5, -2.0], [-0.5, -1.2, 0.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.0, -0.5]
# u = exp(logp - prox) = [e^.1, 1, e^.1], [1, e^.4];  b = exp(prox - behavior) = [e^.2, e^1, e^-.1], [e^.2, e^-.4]
# cap = 2: token (0, 1) has b = e = 2.72 > 2.
# Unclipped per-token loss is -b u A with gradient -b u A (d u / d logp = u); seq 1 token 1 has u = 1.49 > 1.2
# with A < 0: the unclipped side. Five completion tokens in the original mask.


def test_mask_mode_by_hand():
    res = run(make_objective("decoupled_ppo", cap=2.0), LOGP, BEHAVIOR, MASK, ADV, prox_logp=PROX)
    tokens = [-E(0.3), 0.0, -1.0, 0.5 * E(0.2), 0.5]  # the capped token contributes 0 ...
    assert_close(res.loss, sum(tokens) / 5)  # ... but still counts in the denominator (5, not 4)
    assert abs(res.loss - sum(tokens) / 4) > 1e-3
    assert_close(res.grad, [[-E(0.3) / 5, 0.0, -1 / 5], [0.5 * E(0.2) / 5, 0.5 / 5, 0.0]])
    s = res.stats
    assert s["cap_frac"] == pytest.approx(1 / 5)
    b = [E(0.2), E(1.0), E(-0.1), E(0.2), E(-0.4)]  # weight stats: behaviour weights before the cap
    assert s["is_weight_mean"] == pytest.approx(sum(b) / 5)
    assert s["is_weight_max"] == pytest.approx(E(1.0))
    assert s["ess"] == pytest.approx(sum(b) ** 2 / (5 * sum(x * x for x in b)))
    assert s["clip_frac"] == 0.0


def test_mask_mode_seq_mean_keeps_original_counts():
    obj = make_objective("decoupled_ppo", cap=2.0, aggregation="seq_mean_token_mean")
    res = run(obj, LOGP, BEHAVIOR, MASK, ADV, prox_logp=PROX)
    assert_close(res.loss, ((-E(0.3) + 0.0 - 1.0) / 3 + (0.5 * E(0.2) + 0.5) / 2) / 2)


def test_clamp_mode_by_hand():
    res = run(make_objective("decoupled_ppo", cap=2.0, cap_mode="clamp"), LOGP, BEHAVIOR, MASK, ADV, prox_logp=PROX)
    tokens = [-E(0.3), -2.0, -1.0, 0.5 * E(0.2), 0.5]  # b = min(e, 2) = 2 on the capped token
    assert_close(res.loss, sum(tokens) / 5)
    assert_close(res.grad, [[-E(0.3) / 5, -2.0 / 5, -1 / 5], [0.5 * E(0.2) / 5, 0.5 / 5, 0.0]])
    assert res.stats["cap_frac"] == pytest.approx(1 / 5)


def test_eps_high_defaults_to_eps():
    # eps = 0.05: u = e^0.1 = 1.105 > 1.05 with A > 0 on tokens (0, 0) and (0, 2): clipped, no gradient
    res = run(make_objective("decoupled_ppo", cap=2.0, eps=0.05), LOGP, BEHAVIOR, MASK, ADV, prox_logp=PROX)
    assert_close(res.loss, (-E(0.2) * 1.05 + 0.0 - E(-0.1) * 1.05 + 0.5 * E(0.2) + 0.5) / 5)
    assert_close(res.grad, [[0.0, 0.0, 0.0], [0.5 * E(0.2) / 5, 0.5 / 5, 0.0]])
    assert res.stats["clip_frac_high"] == pytest.approx(2 / 4)  # over the 4 tokens that are not capped
    wide = run(make_objective("decoupled_ppo", cap=2.0, eps=0.05, eps_high=0.3), LOGP, BEHAVIOR, MASK, ADV, None, PROX)
    assert_close(wide.grad[0], [-E(0.3) / 5, 0.0, -1 / 5])


def test_requires_prox_logp():
    obj = make_objective("decoupled_ppo")
    assert obj.needs_prox_logp
    with pytest.raises(ValueError, match="prox_logp"):
        run(obj, LOGP, BEHAVIOR, MASK, ADV)


def test_huge_behaviour_weight_is_dropped_cleanly():
    """b = e^100 overflows float32; masked, it must leave no NaN in the loss or gradient."""
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    out = make_objective("decoupled_ppo")(
        logp=logp,
        behavior_logp=torch.tensor([[-101.0, -1.0]]),
        prox_logp=torch.tensor([[-1.0, -1.0]]),
        mask=torch.ones(1, 2),
        advantages=torch.tensor([1.0]),
        group_index=torch.tensor([0]),
    )
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert torch.isfinite(out.loss)
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.5]]))
    assert out.stats["cap_frac"] == 0.5


def test_dual_clip_caps_the_proximal_ratio():
    # u_11 = e^0.4 = 1.49 with A < 0; c = 1.4 < u: loss b c |A| = e^-0.4 * 1.4 * 0.5 and no gradient
    res = run(make_objective("decoupled_ppo", cap=2.0, dual_clip=1.4), LOGP, BEHAVIOR, MASK, ADV, prox_logp=PROX)
    tokens = [-E(0.3), 0.0, -1.0, 0.5 * E(0.2), 0.5 * 1.4 * E(-0.4)]
    assert_close(res.loss, sum(tokens) / 5)
    assert_close(res.grad, [[-E(0.3) / 5, 0.0, -1 / 5], [0.5 * E(0.2) / 5, 0.0, 0.0]])
    assert res.stats["dual_clip_frac"] == pytest.approx(1 / 4)  # over the 4 tokens not dropped by the cap
