"""Behaviour-weight caps (TIS / MIS) by hand: token, sequence and geometric levels, clamp and mask, on every
importance-weighted objective that takes them."""

import math

import pytest
import torch

from heterorl.config import GRPOConfig
from heterorl.objectives import make_objective
from heterorl.objectives.correction import behaviour_correction

from ._helpers import assert_close, run

E = math.exp
# The learner at the start of the step (prox) equals the current parameters on the mask (one update per batch,
# staleness 0): the surrogate ratio u = 1 and only the sampler's mismatch w = prox / behaviour remains.
PROX = [[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]]
LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, 9.0]]  # garbage on the padding
BEHAVIOR = [[-1.5, -0.5, -2.2], [-1.0, -0.2, -7.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
ADV = [1.0, -0.5]
# log w = prox - behaviour = [0.5, 0, 0.2], [0.7, -1.0]; w = 1.65, 1, 1.22 | 2.01, 0.37
W = [[E(0.5), 1.0, E(0.2)], [E(0.7), E(-1.0)]]


def grpo_by_hand(weights: list[list[float]]) -> tuple[float, list[list[float]]]:
    """u = 1: each token's loss is -w_t A_i with gradient -w_t A_i (d u / d logp = u); seq_mean_token_mean."""
    n = [3, 2]
    loss = sum(-w * a / k for ws, a, k in zip(weights, ADV, n, strict=True) for w in ws) / 2
    grad = [[-w * a / k / 2 for w in ws] for ws, a, k in zip(weights, ADV, n, strict=True)]
    grad[1].append(0.0)
    return loss, grad


def test_token_clamp_is_truncated_importance_sampling():
    res = run(make_objective("grpo", cap_mode="clamp", cap=2.0), LOGP, BEHAVIOR, MASK, ADV, prox_logp=PROX)
    loss, grad = grpo_by_hand([W[0], [2.0, W[1][1]]])  # 2.01 truncated to 2
    assert_close(res.loss, loss)
    assert_close(res.grad, grad)
    flat = W[0] + W[1]
    s = res.stats  # weight stats: the behaviour weights before the cap
    assert s["is_weight_mean"] == pytest.approx(sum(flat) / 5)
    assert s["is_weight_max"] == pytest.approx(E(0.7))
    assert s["is_weight_var"] == pytest.approx(sum((w - sum(flat) / 5) ** 2 for w in flat) / 5)
    assert (s["cap_frac"], s["cap_frac_high"], s["cap_frac_low"]) == pytest.approx((1 / 5, 1 / 5, 0.0))
    assert s["clip_frac"] == 0.0  # u = 1


def test_token_mask_drops_both_sides_and_keeps_the_denominator():
    # cap 2, cap_low None = 1/2: 2.01 (too high) and 0.37 (too low) are dropped; sequence 1 keeps n = 2
    res = run(make_objective("grpo", cap_mode="mask", cap=2.0), LOGP, BEHAVIOR, MASK, ADV, prox_logp=PROX)
    loss, grad = grpo_by_hand([W[0], [0.0, 0.0]])
    assert_close(res.loss, loss)
    assert_close(res.grad, grad)
    s = res.stats
    assert (s["cap_frac"], s["cap_frac_high"], s["cap_frac_low"]) == pytest.approx((2 / 5, 1 / 5, 1 / 5))
    # cap_low = 0: the upper side only (AReaL's mask)
    res = run(make_objective("grpo", cap_mode="mask", cap=2.0, cap_low=0.0), LOGP, BEHAVIOR, MASK, ADV, None, PROX)
    assert_close(res.grad, grpo_by_hand([W[0], [0.0, W[1][1]]])[1])


def test_sequence_level_is_the_product_of_token_weights():
    # log w_i = sum_t: 0.7 and -0.3; clamp at 2: w_0 = min(e^0.7, 2) = 2, w_1 = e^-0.3
    res = run(
        make_objective("grpo", cap_mode="clamp", cap=2.0, cap_level="sequence"), LOGP, BEHAVIOR, MASK, ADV, None, PROX
    )
    assert_close(res.grad, grpo_by_hand([[2.0] * 3, [E(-0.3)] * 2])[1])
    assert res.stats["cap_frac"] == pytest.approx(1 / 2)  # over sequences
    assert res.stats["is_weight_mean"] == pytest.approx((E(0.7) + E(-0.3)) / 2)


def test_geometric_level_masks_on_the_per_token_mean():
    # log w_i = mean_t: 0.7/3 and -0.15 -> 1.26 and 0.86; band [1/1.2, 1.2] drops sequence 0 only
    obj = make_objective("grpo", cap_mode="mask", cap=1.2, cap_level="geometric")
    res = run(obj, LOGP, BEHAVIOR, MASK, ADV, prox_logp=PROX)
    assert_close(res.grad, grpo_by_hand([[0.0] * 3, [E(-0.15)] * 2])[1])
    s = res.stats
    assert (s["cap_frac"], s["cap_frac_high"], s["cap_frac_low"]) == pytest.approx((1 / 2, 1 / 2, 0.0))


def test_surrogate_is_taken_against_prox():
    """A cap moves the PPO ratio from logp / behaviour to logp / prox: clipping follows u, weighting follows w."""
    logp = [[-0.7, -0.5, -2.0], [-0.3, -1.2, 0.0]]  # u_00 = e^0.3 = 1.35 > 1.2 with A > 0: clipped, no gradient
    res = run(make_objective("grpo", cap_mode="clamp", cap=2.0), logp, BEHAVIOR, MASK, ADV, prox_logp=PROX)
    _, grad = grpo_by_hand([W[0], [2.0, W[1][1]]])
    grad[0][0] = 0.0
    assert_close(res.grad, grad)
    assert_close(res.loss, grpo_by_hand([[1.2 * W[0][0], *W[0][1:]], [2.0, W[1][1]]])[0])
    assert res.stats["clip_frac_high"] == pytest.approx(1 / 5)
    # without a cap the same logp is compared with the behaviour: rho_00 = e^0.8, also clipped, but rho_10 = e^0.7
    # (A < 0, unclipped side) carries its full weight
    plain = run(make_objective("grpo"), logp, BEHAVIOR, MASK, ADV)
    assert plain.grad[1][0] == pytest.approx(0.5 * E(0.7) / 2 / 2)


def test_huge_weights_are_capped_without_overflow():
    prox = torch.tensor([[0.0, 0.0]], dtype=torch.float32)
    behavior = torch.tensor([[-600.0, -600.0]])  # sequence log weight 1200: e^1200 is not a float
    mask = torch.ones(1, 2, dtype=torch.bool)
    for mode, expected in (("clamp", 3.0), ("mask", 0.0)):
        cfg = GRPOConfig(cap_mode=mode, cap=3.0, cap_level="sequence")
        corr = behaviour_correction(prox, behavior, mask, cfg)
        torch.testing.assert_close(corr.weight_BT, torch.full((1, 2), expected))
        assert corr.stats["cap_frac_high"].item() == 1.0
        assert not any(v.isnan() for v in corr.stats.values())  # the weight stats saturate instead
        assert corr.stats["is_weight_max"].item() == math.inf


@pytest.mark.parametrize(("mode", "level"), [("clamp", "token"), ("mask", "sequence"), ("mask", "geometric")])
def test_decoupled_ppo_is_grpo_with_a_cap(mode: str, level: str):
    g = torch.Generator().manual_seed(3)
    logp = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 2
    batch = {
        "behavior_logp": logp + 0.4 * torch.randn(4, 5, generator=g, dtype=torch.float64),
        "prox_logp": logp + 0.1 * torch.randn(4, 5, generator=g, dtype=torch.float64),
        "mask": torch.rand(4, 5, generator=g) > 0.2,
        "advantages": torch.randn(4, generator=g, dtype=torch.float64),
        "group_index": torch.tensor([0, 0, 1, 1]),
    }
    caps = {"cap_mode": mode, "cap_level": level, "cap": 1.3, "cap_low": 0.8 if mode == "mask" else None}
    outs = []
    for obj in (
        make_objective("grpo", eps_low=0.1, eps_high=0.3, dual_clip=2.0, aggregation="token_mean", **caps),
        make_objective("decoupled_ppo", eps=0.1, eps_high=0.3, dual_clip=2.0, **caps),
    ):
        lp = logp.clone().requires_grad_()
        out = obj(logp=lp, **batch)
        outs.append((out.loss, torch.autograd.grad(out.loss, lp)[0], out.stats))
    (loss_g, grad_g, stats_g), (loss_d, grad_d, stats_d) = outs
    torch.testing.assert_close(loss_g, loss_d)
    torch.testing.assert_close(grad_g, grad_d)
    assert stats_g == pytest.approx(stats_d)
    assert grad_g.abs().sum() > 0


def test_decoupled_ppo_sequence_mask_by_hand():
    # AReaL's default is token level; one weight per sequence: log b_i = 0.7 (> log 2: dropped) and -0.3 (kept)
    obj = make_objective("decoupled_ppo", cap=2.0, cap_level="sequence")
    res = run(obj, LOGP, BEHAVIOR, MASK, ADV, prox_logp=PROX)
    assert_close(res.loss, (0.0 + 0.5 * E(-0.3) * 2) / 5)  # token_mean over the original 5 tokens
    assert_close(res.grad, [[0.0] * 3, [0.5 * E(-0.3) / 5] * 2 + [0.0]])


S = E(0.02)  # GSPO: mean_t(logp - prox) = 0.02 for both sequences
GSPO_LOGP = [[-0.97, -0.53, -1.94], [-0.26, -1.2, 5.0]]


def test_gspo_token_weights_scale_each_tokens_term():
    # eps 0.1: s = 1.02 unclipped; loss = mean_i mean_t (-w_t A_i s_i); d/dlogp_t = -w_t A_i s_i / n_i / B
    obj = make_objective("gspo", eps_low=0.1, eps_high=0.1, cap_mode="clamp", cap=2.0)
    res = run(obj, GSPO_LOGP, BEHAVIOR, MASK, ADV, prox_logp=PROX)
    w = [W[0], [2.0, W[1][1]]]
    assert_close(res.loss, (-S * sum(w[0]) / 3 + 0.5 * S * sum(w[1]) / 2) / 2)
    assert_close(res.grad, [[-S * x / 3 / 2 for x in w[0]], [0.5 * S * x / 2 / 2 for x in w[1]] + [0.0]])


def test_gspo_sequence_weight_multiplies_the_sequence_loss():
    # eps 0.01: s_0 = 1.0202 > 1.01 with A > 0 is clipped (no gradient); s_1 on the unclipped side (A < 0)
    obj = make_objective("gspo", eps_low=0.01, eps_high=0.01, cap_mode="clamp", cap=2.0, cap_level="sequence")
    res = run(obj, GSPO_LOGP, BEHAVIOR, MASK, ADV, prox_logp=PROX)
    assert_close(res.loss, (-2.0 * 1.01 + 0.5 * E(-0.3) * S) / 2)
    assert_close(res.grad, [[0.0] * 3, [0.5 * E(-0.3) * S / 2 / 2] * 2 + [0.0]])
    assert res.stats["clip_frac_high"] == pytest.approx(1 / 2)


def test_gepo_with_a_cap_takes_the_group_expectation_over_prox():
    # one group; p = exp(mean logp), the proximal "q" = exp(mean prox) = p on the mask: w_i = p_i sum p / sum p^2
    p = [E(-3.5 / 3), E(-1.5 / 2)]
    w = [x * sum(p) / sum(y * y for y in p) for x in p]  # 0.76 and 1.16: inside eps = 0.5
    obj = make_objective("gepo", eps=0.5, cap_mode="clamp", cap=2.0)
    res = run(obj, LOGP, BEHAVIOR, MASK, ADV, group_index=[7, 7], prox_logp=PROX)
    v = [W[0], [2.0, W[1][1]]]
    assert_close(res.loss, (-1.0 * w[0] * sum(v[0]) / 3 + 0.5 * w[1] * sum(v[1]) / 2) / 2)
    assert_close(res.grad, [[-w[0] * x / 3 / 2 for x in v[0]], [0.5 * w[1] * x / 2 / 2 for x in v[1]] + [0.0]])
    assert res.stats["gepo_kl"] == pytest.approx(0.0)  # against prox


@pytest.mark.parametrize("name", ["grpo", "gspo", "gepo", "cispo"])
@pytest.mark.parametrize(("mode", "level"), [("clamp", "token"), ("mask", "sequence"), ("clamp", "geometric")])
def test_a_cap_changes_nothing_when_the_sampler_is_the_proximal_policy(name: str, mode: str, level: str):
    """behaviour = prox: every behaviour weight is 1, so the capped objective is the plain one against prox."""
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 2
    prox = logp + 0.1 * torch.randn(4, 6, generator=g, dtype=torch.float64)
    batch = {
        "mask": torch.rand(4, 6, generator=g) > 0.3,
        "advantages": torch.randn(4, generator=g, dtype=torch.float64),
        "group_index": torch.tensor([0, 0, 1, 1]),
    }
    clip = {"gepo": {"eps": 0.02}, "cispo": {"eps_high": 0.02}}.get(name, {"eps_low": 0.02, "eps_high": 0.02})
    results = []
    for hp, kwargs in (
        ({"cap_mode": mode, "cap_level": level}, {"behavior_logp": prox, "prox_logp": prox}),
        ({}, {"behavior_logp": prox}),
    ):
        lp = logp.clone().requires_grad_()
        out = make_objective(name, **clip, **hp)(logp=lp, **batch, **kwargs)
        results.append((out.loss, torch.autograd.grad(out.loss, lp)[0], out.stats))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])
    assert results[0][2]["clip_frac"] == pytest.approx(results[1][2]["clip_frac"])
    assert results[0][2]["cap_frac"] == 0.0
    assert results[1][2]["clip_frac"] > 0  # the clip does act: the comparison is not vacuous


def test_cap_needs_prox_logp():
    obj = make_objective("gspo", cap_mode="mask")
    assert obj.needs_prox_logp
    assert not make_objective("gspo").needs_prox_logp
    with pytest.raises(ValueError, match="prox_logp"):
        run(obj, LOGP, BEHAVIOR, MASK, ADV)
