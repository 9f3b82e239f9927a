"""CISPO: REINFORCE with a clipped, stop-gradient token importance weight (MiniMax-M1)."""

from __future__ import annotations

import torch

from heterorl.config import CISPOConfig
from heterorl.objectives.aggregation import aggregate
from heterorl.objectives.base import LossParts, ObjectiveBatch
from heterorl.objectives.correction import maybe_correction
from heterorl.objectives.diagnostics import log_weight_stats, masked_fraction


def cispo(batch: ObjectiveBatch, cfg: CISPOConfig) -> LossParts:
    """r_t = exp(logp_t - behavior_logp_t);  l_t = -sg(clip(r_t, 1-eps_low, 1+eps_high)) A_i logp_t;
    loss = aggregate(l, cfg.aggregation) (token_mean, the paper's 1 / sum_i |o_i|).  With a behaviour-weight cap
    (cap_mode clamp / mask): r_t = exp(logp_t - prox_logp_t) and the weight is multiplied by the capped
    sg(pi_prox / mu) per token or per sequence.

    Source: MiniMax-M1 (arXiv 2506.13585), section 3.1. Why: PPO's clip zeroes the gradient of the tokens whose
    ratio left the trust region, often the rare "fork" tokens (However, Wait, Recheck) that reasoning RL needs;
    CISPO bounds the weight instead, so every token keeps a gradient A grad logp scaled by at most 1 + eps_high.
    Defaults: the paper sets no lower bound (eps_low large; here 1, a bound of 0 on a non-negative weight) and
    tunes only eps_high; eps_high = 3 (weights <= 4) is Tinker's CISPO default (clip_high_threshold 4.0).
    Departures: the paper's optional token mask M (PPO-style trust region)
    is not implemented; the ratio is against the sampler's recorded log-probs (against pi_prox with a cap).
    Weight stats: the ratios r_t before the clip (no cap) or the behaviour weights before the cap. clip_frac_low /
    clip_frac_high: share of tokens whose weight was clipped below / above, whatever the advantage's sign (the
    gradient is scaled, never zeroed).
    """
    correction = maybe_correction(batch, cfg)
    anchor_BT = batch.behavior_logp if correction is None else batch.anchor_logp
    log_ratio_BT = (batch.logp - anchor_BT).detach()
    ratio_BT = torch.exp(log_ratio_BT)
    weight_BT = ratio_BT.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)
    kept_BT = batch.mask
    if correction is not None:
        weight_BT = weight_BT * correction.weight_BT
        kept_BT = correction.kept_BT
    loss_BT = -(weight_BT * batch.adv[:, None]) * batch.logp
    loss = aggregate(loss_BT, batch.mask, cfg.aggregation)
    with torch.no_grad():
        weight_stats = log_weight_stats(log_ratio_BT, batch.mask) if correction is None else correction.stats
        low = masked_fraction(ratio_BT < 1.0 - cfg.eps_low, kept_BT)
        high = masked_fraction(ratio_BT > 1.0 + cfg.eps_high, kept_BT)
        stats = {**weight_stats, "clip_frac": low + high, "clip_frac_low": low, "clip_frac_high": high}
    return LossParts(loss, stats)
