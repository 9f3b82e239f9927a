"""GEPO by hand: the group expectation denominator, clip, KL penalty, gepo+ switch, defensive mixture."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heterorl.objectives import make_objective
from heterorl.objectives.gepo import gepo_log_weight

from ._helpers import assert_close, run

E = math.exp
# Two groups (ids 5 and 2); length-normalised log-probs: lp = (-1.0, -1.7, -0.6), lq = (-1.1, -1.8, -0.7).
LOGP = [[-0.9, -1.1], [-1.9, -1.5], [-0.6, 30.0]]
BEHAVIOR = [[-1.0, -1.2], [-2.0, -1.6], [-0.7, -30.0]]
MASK = [[1, 1], [1, 1], [1, 0]]
ADV = [0.5, -0.5, 0.3]
GROUPS = [5, 5, 2]
Q0, Q1, Q2 = E(-1.1), E(-1.8), E(-0.7)
EQ5 = (Q0**2 + Q1**2) / (Q0 + Q1)  # shared by sequences 0 and 1
W = [E(-1.0) / EQ5, E(-1.7) / EQ5, E(-0.6) / Q2]  # group 2 has one member: E_q[q] = q_2; w = 1.33, 0.66, 1.11


def test_gepo_unclipped_by_hand():
    res = run(make_objective("gepo", eps=0.5), LOGP, BEHAVIOR, MASK, ADV, GROUPS)
    assert_close(res.loss, (-0.5 * W[0] + 0.5 * W[1] - 0.3 * W[2]) / 3)
    # d w_i / d logp_t = w_i / n_i (the denominator is detached); loss is a mean over B = 3
    assert_close(res.grad, [[-0.5 * W[0] / 2 / 3] * 2, [0.5 * W[1] / 2 / 3] * 2, [-0.3 * W[2] / 3, 0.0]])
    assert res.stats["is_weight_mean"] == pytest.approx(sum(W) / 3)
    assert res.stats["is_weight_max"] == pytest.approx(W[0])
    assert res.stats["ess"] == pytest.approx(sum(W) ** 2 / (3 * sum(w * w for w in W)))


def test_gepo_clipped_by_hand():
    # default eps = 0.2: w0 = 1.33 > 1.2 with A > 0 and w1 = 0.66 < 0.8 with A < 0 are clipped
    res = run(make_objective("gepo"), LOGP, BEHAVIOR, MASK, ADV, GROUPS)
    assert_close(res.loss, (-1.2 * 0.5 + 0.8 * 0.5 - 0.3 * W[2]) / 3)
    assert_close(res.grad, [[0.0, 0.0], [0.0, 0.0], [-0.3 * W[2] / 3, 0.0]])
    assert res.stats["clip_frac"] == pytest.approx(2 / 3)
    assert res.stats["clip_frac_low"] == pytest.approx(1 / 3)
    assert res.stats["clip_frac_high"] == pytest.approx(1 / 3)


def test_gepo_kl_penalty_by_hand():
    beta = 0.005
    res = run(make_objective("gepo", eps=0.5, kl_beta=beta), LOGP, BEHAVIOR, MASK, ADV, GROUPS)
    kl = E(-0.1) + 0.1 - 1  # every token has lq - lp = -0.1
    assert_close(res.loss, (-0.5 * W[0] + 0.5 * W[1] - 0.3 * W[2]) / 3 + beta * kl)
    dkl = beta * (1 - E(-0.1)) / 3  # d/dlp of exp(lq - lp) - (lq - lp) - 1, per token / n_i, / B
    expected = [
        [-0.5 * W[0] / 6 + dkl / 2] * 2,
        [0.5 * W[1] / 6 + dkl / 2] * 2,
        [-0.3 * W[2] / 3 + dkl, 0.0],
    ]
    assert_close(res.grad, expected)
    assert res.stats["gepo_kl"] == pytest.approx(kl)


def test_gepo_switch_by_hand():
    # sequence 1 on-policy (KL = 0 < kappa): its denominator is q_1 = p_1, so w_1 = 1; the others keep E_q[q]
    behavior = [BEHAVIOR[0], LOGP[1], BEHAVIOR[2]]
    res = run(make_objective("gepo", eps=0.5, switch=True), LOGP, behavior, MASK, ADV, GROUPS)
    q0, q1 = E(-1.1), E(-1.7)
    w0 = E(-1.0) / ((q0**2 + q1**2) / (q0 + q1))
    w2 = E(0.1)  # KL_2 = e^-0.1 + 0.1 - 1 = 0.0048 > 0.002: no switch
    assert_close(res.loss, (-0.5 * w0 + 0.5 * 1.0 - 0.3 * w2) / 3)
    assert_close(res.grad, [[-0.5 * w0 / 6] * 2, [0.5 / 6] * 2, [-0.3 * w2 / 3, 0.0]])
    assert res.stats["switch_frac"] == pytest.approx(1 / 3)
    # kappa above every KL: all sequences use q_i, i.e. GSPO's ratio p_i / q_i = e^0.1
    res = run(make_objective("gepo", eps=0.5, switch=True, switch_kappa=0.01), LOGP, BEHAVIOR, MASK, ADV, GROUPS)
    assert_close(res.loss, (-0.5 + 0.5 - 0.3) * E(0.1) / 3)


def test_gepo_defensive_by_hand():
    lam = 0.5
    p = [E(-1.0), E(-1.7), E(-0.6)]
    den = [EQ5, EQ5, Q2]
    w = [pi / ((1 - lam) * d + lam * pi) for pi, d in zip(p, den, strict=True)]
    res = run(make_objective("gepo", eps=0.5, defensive_lam=lam), LOGP, BEHAVIOR, MASK, ADV, GROUPS)
    assert_close(res.loss, (-0.5 * w[0] + 0.5 * w[1] - 0.3 * w[2]) / 3)
    assert_close(res.grad, [[-0.5 * w[0] / 6] * 2, [0.5 * w[1] / 6] * 2, [-0.3 * w[2] / 3, 0.0]])
    assert all(x <= 1 / lam for x in w)


def test_denominator_shared_within_group_and_different_between_groups():
    torch.manual_seed(1)
    groups = torch.tensor([3, 8, 3, 8, 3, 0])
    lp = -torch.rand(6, dtype=torch.float64)
    lq = -torch.rand(6, dtype=torch.float64)
    log_den = lp - gepo_log_weight(lp, lq, groups, defensive_lam=0.0)
    for g in (3, 8):
        members = log_den[groups == g]
        torch.testing.assert_close(members, members[:1].expand_as(members))
    assert len({round(x, 9) for x in (log_den[0].item(), log_den[1].item(), log_den[5].item())}) == 3


def test_changing_one_behaviour_moves_only_its_group():
    """Behaviour of sequence 1 enters E_q[q] of group 5 (sequence 0) but not group 2 (sequence 2)."""
    obj = make_objective("gepo", eps=0.5)
    base = run(obj, LOGP, BEHAVIOR, MASK, ADV, GROUPS)
    moved = run(obj, LOGP, [BEHAVIOR[0], [-1.0, -1.0], BEHAVIOR[2]], MASK, ADV, GROUPS)
    assert abs(moved.grad[0][0] - base.grad[0][0]) > 1e-3
    assert moved.grad[2] == base.grad[2]


def test_sequence_without_tokens_takes_no_part():
    obj = make_objective("gepo", eps=0.5)
    base = run(obj, LOGP, BEHAVIOR, MASK, ADV, GROUPS)
    extra = run(obj, [*LOGP, [5.0, 5.0]], [*BEHAVIOR, [9.0, 9.0]], [*MASK, [0, 0]], [*ADV, 1.0], [*GROUPS, 5])
    assert_close(extra.loss, base.loss * 3 / 4)  # counts in B, contributes 0
    assert_close(extra.grad[:3], [[g * 3 / 4 for g in row] for row in base.grad])


@pytest.mark.parametrize("hp", [{}, {"kl_beta": 0.005}, {"switch": True, "kl_beta": 0.005}, {"defensive_lam": 0.3}])
def test_finite_with_50_nat_gaps(hp: dict):
    B, T = 6, 4
    logp = torch.full((B, T), -1.0).requires_grad_()
    # behaviour - learner gaps; group 1 lies 40-50 nats below the learner, so weights reach e^40
    gap = torch.tensor([[50.0] * 4, [-50.0] * 4, [50.0, -50.0, 50.0, -50.0], [-50.0] * 4, [-40.0] * 4, [-50.0] * 4])
    out = make_objective("gepo", **hp)(
        logp=logp,
        behavior_logp=logp.detach() + gap,
        mask=torch.ones(B, T),
        advantages=torch.tensor([1.0, -1.0, 0.5, -0.5, -1.0, 1.0]),
        group_index=torch.tensor([0, 0, 0, 1, 1, 1]),
    )
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert torch.isfinite(out.loss)
    assert torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in out.stats.values()), out.stats
    lam = hp.get("defensive_lam", 0.0)
    if lam > 0:
        assert out.stats["is_weight_max"] <= 1 / lam + 1e-6  # the defensive mixture bounds the weight
    else:
        assert out.stats["is_weight_max"] > 1e17  # e^40: the extreme weights were really exercised
        assert grad.abs().max() > 1e15


def test_defensive_lam_one_is_policy_gradient():
    torch.manual_seed(2)
    B, T = 6, 5
    logp = -torch.rand(B, T, dtype=torch.float64) * 2
    mask = torch.rand(B, T) < 0.8
    mask[:, 0] = True
    args = {
        "behavior_logp": logp - torch.randn(B, T, dtype=torch.float64),
        "mask": mask,
        "advantages": torch.randn(B, dtype=torch.float64),
        "group_index": torch.tensor([0, 0, 0, 1, 1, 1]),
    }
    lp1, lp2 = logp.clone().requires_grad_(), logp.clone().requires_grad_()
    gepo = make_objective("gepo", defensive_lam=1.0)(logp=lp1, **args)
    pg = make_objective("pg", aggregation="seq_mean_token_mean")(logp=lp2, **args)
    torch.testing.assert_close(torch.autograd.grad(gepo.loss, lp1)[0], torch.autograd.grad(pg.loss, lp2)[0])
    assert gepo.stats["is_weight_mean"] == pytest.approx(1.0)
    assert gepo.stats["is_weight_var"] == pytest.approx(0.0)
    assert gepo.stats["ess"] == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 3), st.floats(-5, 0), st.floats(-5, 0)), min_size=1, max_size=12),
    lam=st.floats(0, 1),
)
def test_log_space_weight_equals_direct_formula(rows: list[tuple[int, float, float]], lam: float):
    groups = [g for g, _, _ in rows]
    lp = [a for _, a, _ in rows]
    lq = [b for _, _, b in rows]
    expected = []
    for g, a, _ in rows:
        qs = [math.exp(b) for gj, _, b in rows if gj == g]
        eq = sum(q * q for q in qs) / sum(qs)
        expected.append(math.exp(a) / ((1 - lam) * eq + lam * math.exp(a)))
    log_w = gepo_log_weight(
        torch.tensor(lp, dtype=torch.float64), torch.tensor(lq, dtype=torch.float64), torch.tensor(groups), lam
    )
    torch.testing.assert_close(log_w.exp(), torch.tensor(expected, dtype=torch.float64), rtol=1e-9, atol=0)
