"""GSPO: one length-normalised importance ratio per sequence with a narrow clip (algorithms.md section 3)."""

from __future__ import annotations

import torch

from heterorl.config import GSPOConfig
from heterorl.objectives.aggregation import seq_mean
from heterorl.objectives.base import LossParts, ObjectiveBatch
from heterorl.objectives.diagnostics import log_weight_stats
from heterorl.objectives.ratios import clip_fractions, clipped_surrogate


def gspo(batch: ObjectiveBatch, cfg: GSPOConfig) -> LossParts:
    """s_i = exp(mean_t(logp_t - behavior_logp_t));  l_i = -min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i);
    loss = mean over the B sequences.

    Source: GSPO (arXiv 2507.18071), its clip range 3e-4 / 4e-4 is the default. The geometric-mean ratio keeps
    the weight of a whole sequence on the scale of one token, and clipping acts on whole sequences, so one
    mismatched token cannot dominate. Departures: none in the loss; the ratio is against the sampler's recorded
    log-probs. Gradient: s_i A_i mean_t grad logp_t (unclipped), i.e. GRPO with the token ratio replaced by s_i.
    Weight stats: the sequence ratios s_i.
    """
    log_s_B = seq_mean(batch.log_ratio, batch.mask)
    s_B = torch.exp(log_s_B)
    valid_B = batch.seq_valid
    loss_B = clipped_surrogate(s_B, batch.adv, cfg.eps_low, cfg.eps_high)
    loss = torch.where(valid_B, loss_B, 0.0).mean()
    with torch.no_grad():
        stats = {
            **log_weight_stats(log_s_B, valid_B),
            **clip_fractions(s_B, batch.adv, cfg.eps_low, cfg.eps_high, valid_B),
        }
    return LossParts(loss, stats)
