"""GRPO: token-level importance ratio against the behaviour policy with the PPO clip (algorithms.md section 2)."""

from __future__ import annotations

import torch

from heterorl.config import GRPOConfig
from heterorl.objectives.aggregation import aggregate
from heterorl.objectives.base import LossParts, ObjectiveBatch
from heterorl.objectives.diagnostics import log_weight_stats
from heterorl.objectives.ratios import clip_fractions, clipped_surrogate


def grpo(batch: ObjectiveBatch, cfg: GRPOConfig) -> LossParts:
    """rho_t = exp(logp_t - behavior_logp_t);  l_t = -min(rho_t A_i, clip(rho_t, 1-eps_low, 1+eps_high) A_i);
    loss = aggregate(l, cfg.aggregation).

    Source: DeepSeekMath (GRPO, arXiv 2402.03300); eps_high > eps_low is DAPO's clip-higher; the aggregation modes
    cover GRPO (seq_mean_token_mean), DAPO (token_mean) and Dr.GRPO. Departures: the ratio is taken against the
    sampler's recorded log-probs (the behaviour policy, possibly many versions stale) rather than a fresh
    "old policy" forward pass, and there is no reference-model KL term. Each token has its own denominator
    q_t, so a single badly mismatched token can carry a huge weight on the unclipped side (A < 0).
    Weight stats: the token ratios rho over completion tokens.
    """
    log_ratio_BT = batch.log_ratio
    ratio_BT = torch.exp(log_ratio_BT)
    adv_B1 = batch.adv[:, None]
    loss_BT = clipped_surrogate(ratio_BT, adv_B1, cfg.eps_low, cfg.eps_high)
    loss = aggregate(loss_BT, batch.mask, cfg.aggregation)
    with torch.no_grad():
        stats = {
            **log_weight_stats(log_ratio_BT, batch.mask),
            **clip_fractions(ratio_BT, adv_B1, cfg.eps_low, cfg.eps_high, batch.mask),
        }
    return LossParts(loss, stats)
