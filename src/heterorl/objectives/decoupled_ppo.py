"""AReaL's decoupled PPO: clip against the proximal policy, weight by the capped behaviour ratio (section 6)."""

from __future__ import annotations

import torch

from heterorl.config import DecoupledPPOConfig
from heterorl.objectives.aggregation import aggregate
from heterorl.objectives.base import LossParts, ObjectiveBatch
from heterorl.objectives.diagnostics import log_weight_stats, masked_fraction
from heterorl.objectives.ratios import clip_fractions, clipped_surrogate


def decoupled_ppo(batch: ObjectiveBatch, cfg: DecoupledPPOConfig) -> LossParts:
    """u_t = exp(logp_t - prox_logp_t);  b_t = sg(exp(prox_logp_t - behavior_logp_t));
    l_t = b_t * -min(u_t A_i, clip(u_t, 1-eps, 1+eps_high) A_i);  loss = aggregate(l, cfg.aggregation).
    cap_mode "mask": tokens with b_t > cap contribute 0 but still count in the denominator (the ORIGINAL mask's
    token count); "clamp": b_t = min(b_t, cap) (truncated IS).

    Source: AReaL (arXiv 2505.24298) and its repo. Why: the trust region is taken around the proximal policy
    (the learner's parameters before this optimizer step), which the learner can compute, while the staleness of
    the sampler is corrected by the behaviour weight b; the cap bounds its variance. With one optimizer step per
    batch u = 1 (with gradient) and this is PG with capped token-level IS. Departures: none (eps_high None = eps).
    Weight stats: the behaviour weights b_t before the cap; clip stats: u over the tokens that are not capped.
    """
    if batch.prox_logp is None:
        raise ValueError("decoupled_ppo needs prox_logp (log-probs before this optimizer step)")
    mask_BT = batch.mask
    adv_B1 = batch.adv[:, None]
    eps_high = cfg.eps if cfg.eps_high is None else cfg.eps_high
    u_BT = torch.exp(batch.logp - batch.prox_logp)
    log_b_BT = batch.prox_logp - batch.behavior_logp  # detached: both inputs are
    b_BT = torch.exp(log_b_BT)
    over_cap_BT = b_BT > cfg.cap
    if cfg.cap_mode == "mask":
        b_BT = torch.where(over_cap_BT, 0.0, b_BT)
        kept_BT = mask_BT & ~over_cap_BT
    else:
        b_BT = b_BT.clamp(max=cfg.cap)
        kept_BT = mask_BT
    loss_BT = b_BT * clipped_surrogate(u_BT, adv_B1, cfg.eps, eps_high)
    loss = aggregate(loss_BT, mask_BT, cfg.aggregation)  # original mask: dropped tokens keep their denominator
    with torch.no_grad():
        stats = {
            **log_weight_stats(log_b_BT, mask_BT),
            **clip_fractions(u_BT, adv_B1, cfg.eps, eps_high, kept_BT),
            "cap_frac": masked_fraction(over_cap_BT, mask_BT),
        }
    return LossParts(loss, stats)
