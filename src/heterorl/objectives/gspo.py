"""GSPO: one length-normalised importance ratio per sequence with a narrow clip (docs/objectives.md)."""

from __future__ import annotations

import torch

from heterorl.config import GSPOConfig
from heterorl.objectives.aggregation import seq_mean, seq_mean_token_mean
from heterorl.objectives.base import LossParts, ObjectiveBatch
from heterorl.objectives.correction import maybe_correction
from heterorl.objectives.diagnostics import log_weight_stats
from heterorl.objectives.ratios import clip_fractions, clipped_surrogate, token_form


def gspo(batch: ObjectiveBatch, cfg: GSPOConfig) -> LossParts:
    """s_i = exp(mean_t(logp_t - behavior_logp_t));  l_i = -min(s_i A_i, clip(s_i, 1-eps_low, 1+eps_high) A_i);
    loss = mean over the B sequences.  With a behaviour-weight cap (cap_mode clamp / mask): s_i is taken against
    prox_logp and loss = seq_mean_token_mean(w PPO(s_it, A_i)), s_it = GSPO-token form of s_i (`token_form`),
    w = capped sg(pi_prox / mu) per token or per sequence; with a sequence weight this is w_i PPO(s_i, A_i).

    Source: GSPO (arXiv 2507.18071), its clip range 3e-4 / 4e-4 is the default. The geometric-mean ratio keeps
    the weight of a whole sequence on the scale of one token, and clipping acts on whole sequences, so one
    mismatched token cannot dominate. Departures: none in the loss; the ratio is against the sampler's recorded
    log-probs (against pi_prox with a cap). Gradient: s_i A_i mean_t grad logp_t (unclipped), i.e. GRPO with the
    token ratio replaced by s_i. Weight stats: the sequence ratios s_i (no cap) or the behaviour weights.
    """
    correction = maybe_correction(batch, cfg)
    anchor_BT = batch.behavior_logp if correction is None else batch.anchor_logp
    log_s_B = seq_mean(batch.logp - anchor_BT, batch.mask)
    s_B = torch.exp(log_s_B)
    if correction is None:
        valid_B = batch.seq_valid
        loss_B = clipped_surrogate(s_B, batch.adv, cfg.eps_low, cfg.eps_high)
        loss = torch.where(valid_B, loss_B, 0.0).mean()
    else:
        valid_B = correction.kept_BT.any(dim=-1)
        s_BT = token_form(s_B, batch.logp)
        loss_BT = correction.weight_BT * clipped_surrogate(s_BT, batch.adv[:, None], cfg.eps_low, cfg.eps_high)
        loss = seq_mean_token_mean(loss_BT, batch.mask)
    with torch.no_grad():
        weight_stats = log_weight_stats(log_s_B, valid_B) if correction is None else correction.stats
        stats = {**weight_stats, **clip_fractions(s_B, batch.adv, cfg.eps_low, cfg.eps_high, valid_B)}
    return LossParts(loss, stats)
