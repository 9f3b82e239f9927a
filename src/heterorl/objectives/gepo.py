"""GEPO: group-expectation importance weight shared by the completions of one prompt (docs/objectives.md)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from heterorl.config import GEPOConfig
from heterorl.objectives.aggregation import seq_mean, seq_mean_token_mean
from heterorl.objectives.base import LossParts, ObjectiveBatch
from heterorl.objectives.correction import maybe_correction
from heterorl.objectives.diagnostics import k3, log_weight_stats, masked_fraction
from heterorl.objectives.groups import dense_group_ids, group_logsumexp
from heterorl.objectives.ratios import clip_fractions, clipped_surrogate, token_form


def log_group_expectation(lq_B: Tensor, group_index_B: Tensor) -> Tensor:
    """[B]: log E_q[q] of each sequence's group, E_q[q] = sum_j q_j^2 / sum_j q_j over the group's completions.

    In log space: logsumexp_j(2 lq_j) - logsumexp_j(lq_j), so q = exp(lq) never under- or overflows.
    """
    ids_B, G = dense_group_ids(group_index_B)
    log_eq_G = group_logsumexp(2 * lq_B, ids_B, G) - group_logsumexp(lq_B, ids_B, G)
    return log_eq_G[ids_B]


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def gepo_log_weight(
    lp_B: Tensor, lq_B: Tensor, group_index_B: Tensor, defensive_lam: float, use_q_B: Tensor | None = None
) -> Tensor:
    """[B]: log w_i, w_i = p_i / ((1 - lam) D_i + lam sg(p_i)) with D_i = E_q[q] of the group, or q_i where
    `use_q_B` (the gepo+ switch). Everything but p_i in the numerator is detached.

    lp_B, lq_B are length-normalised sequence log-probs (mean_t logp, mean_t behavior_logp). The mixture is a
    log-space logaddexp; lam = 0 is plain GEPO, lam = 1 gives w = p / sg(p) = 1 with gradient grad log p (plain PG),
    and in between w <= 1 / lam.
    """
    log_den_B = log_group_expectation(lq_B.detach(), group_index_B)
    if use_q_B is not None:
        log_den_B = torch.where(use_q_B, lq_B.detach(), log_den_B)
    if defensive_lam > 0:
        log_den_B = torch.logaddexp(log_den_B + _log(1.0 - defensive_lam), lp_B.detach() + _log(defensive_lam))
    return lp_B - log_den_B


def gepo(batch: ObjectiveBatch, cfg: GEPOConfig) -> LossParts:
    """p_i = exp(mean_t logp), q_i = exp(mean_t behavior_logp), E_q[q] = sum_j q_j^2 / sum_j q_j over the group;
    w_i = p_i / sg(E_q[q])  (defensive: p_i / ((1-lam) E_q[q] + lam sg(p_i)); gepo+: q_i replaces E_q[q] where
    KL_i < kappa);  l_i = -min(w_i A_i, clip(w_i, 1-eps, 1+eps) A_i);
    loss = mean_i l_i + kl_beta * mean_i KL_i,  KL_i = mean_t(exp(lq_t - lp_t) - (lq_t - lp_t) - 1).
    With a behaviour-weight cap (cap_mode clamp / mask) q is the proximal policy pi_prox everywhere above (E_q[q],
    KL_i, the switch) and loss = seq_mean_token_mean(v PPO(w_it, A_i)) + kl_beta * mean_i KL_i, w_it the
    GSPO-token form of w_i (`token_form`), v = capped sg(pi_prox / mu) per token or per sequence.

    Source: GEPO (arXiv 2508.17850) and the authors' code (HanlardResearch/Hetero-RL). Why: every sequence of a
    group shares one denominator, so the weight's variance no longer grows with the per-sequence mismatch
    (Theorem 1: Var[p/q] - Var[p/E_q[q]] >= exp(KL(p||q)) - C). Departures: the group is the completions of one
    prompt (`group_index`), as in the paper, not the authors' shuffled micro-batch; defensive sampling is this
    project's extension, and composes with the switch as (1-lam) D_i + lam sg(p_i) with D_i = q_i or E_q[q]; the
    switch's KL_i is the same per-sequence KL as the penalty, detached; the cap is this project's extension
    (the group expectation then measures the learner's own drift within the step, the cap the sampler gap).
    Even on-policy w_i != 1. Weight stats: the sequence weights w_i before clipping (no cap) or the behaviour
    weights before the cap.
    """
    mask_BT = batch.mask
    valid_B = batch.seq_valid
    correction = maybe_correction(batch, cfg)
    anchor_BT = batch.behavior_logp if correction is None else batch.anchor_logp
    lp_B = seq_mean(batch.logp, mask_BT)
    lq_B = seq_mean(anchor_BT, mask_BT)
    kl_B = seq_mean(k3(anchor_BT - batch.logp), mask_BT)  # k3 with log r = lq - lp
    use_q_B = (kl_B.detach() < cfg.switch_kappa) & valid_B if cfg.switch else None
    # A sequence without completion tokens takes no part in its group's expectation (q = 0) and gets w = 1.
    lq_B = torch.where(valid_B, lq_B, -torch.inf)
    log_w_B = gepo_log_weight(lp_B, lq_B, batch.group_index, cfg.defensive_lam, use_q_B)
    log_w_B = torch.where(valid_B, log_w_B, 0.0)
    w_B = torch.exp(log_w_B)
    if correction is None:
        clip_valid_B = valid_B
        loss_B = clipped_surrogate(w_B, batch.adv, cfg.eps, cfg.eps)
        loss = torch.where(valid_B, loss_B, 0.0).mean()
    else:
        clip_valid_B = correction.kept_BT.any(dim=-1)
        loss_BT = clipped_surrogate(token_form(w_B, batch.logp), batch.adv[:, None], cfg.eps, cfg.eps)
        loss = seq_mean_token_mean(correction.weight_BT * loss_BT, mask_BT)
    if cfg.kl_beta > 0:  # skipped at 0 so that an infinite KL (gap > 88 nats) cannot turn 0 * inf into NaN
        loss = loss + cfg.kl_beta * kl_B.mean()
    with torch.no_grad():
        weight_stats = log_weight_stats(log_w_B, valid_B) if correction is None else correction.stats
        stats = {
            **weight_stats,
            **clip_fractions(w_B, batch.adv, cfg.eps, cfg.eps, clip_valid_B),
            "gepo_kl": kl_B.double().mean(),
        }
        if use_q_B is not None:
            stats["switch_frac"] = masked_fraction(use_q_B, valid_B)
    return LossParts(loss, stats)
