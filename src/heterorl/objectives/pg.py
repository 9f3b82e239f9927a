"""Baselines without clipping (docs/objectives.md): REINFORCE and truncated sequence-level IS."""

from __future__ import annotations

import math

import torch

from heterorl.config import ISPGConfig, PGConfig
from heterorl.objectives.aggregation import aggregate, masked_sum
from heterorl.objectives.base import LossParts, ObjectiveBatch
from heterorl.objectives.diagnostics import log_weight_stats, masked_fraction, token_ratio_weight_stats


def pg(batch: ObjectiveBatch, cfg: PGConfig) -> LossParts:
    """loss = aggregate(-sg(A_i) logp_t, cfg.aggregation): REINFORCE with the group-mean baseline.

    Source: Williams (1992); the DG papers' "PG, no correction" baseline (arXiv 2603.14608). Ignores
    behavior_logp in the loss: stale samples are treated as on-policy.
    Weight stats (diagnostic only): the token ratio p/q, so the learner–sampler mismatch stays visible.
    """
    loss_BT = -batch.adv[:, None] * batch.logp
    loss = aggregate(loss_BT, batch.mask, cfg.aggregation)
    with torch.no_grad():
        stats = token_ratio_weight_stats(batch)
    return LossParts(loss, stats)


def is_pg(batch: ObjectiveBatch, cfg: ISPGConfig) -> LossParts:
    """w_i = sg(min(exp(sum_t(logp_t - behavior_logp_t)), truncate));
    loss = aggregate(-(w_i A_i) logp_t, cfg.aggregation), i.e. gradient w_i A_i grad(aggregated log p_i).

    Source: the DG papers' importance-weighted PG baseline (arXiv 2603.14608, truncation at 10). The weight is the
    exact (not length-normalised) sequence ratio, computed as exp(min(log w, log truncate)) so it never overflows;
    it multiplies the sequence's token terms, which are then aggregated like every other objective (with
    seq_mean_token_mean the gradient is w_i A_i mean_t grad logp_t; with dr_grpo, the paper's sum over tokens up
    to a constant). Stats: the untruncated weights; clip_frac = clip_frac_high = share of truncated sequences
    (clip_frac_low is always 0).
    """
    valid_B = batch.seq_valid
    log_w_B = masked_sum(batch.log_ratio.detach(), batch.mask, dim=-1)
    log_cap = math.log(cfg.truncate)
    w_B = torch.exp(log_w_B.clamp(max=log_cap))
    loss_BT = -(w_B * batch.adv)[:, None] * batch.logp
    loss = aggregate(loss_BT, batch.mask, cfg.aggregation)
    with torch.no_grad():
        truncated = masked_fraction(log_w_B > log_cap, valid_B)
        stats = {
            **log_weight_stats(log_w_B, valid_B),
            "clip_frac": truncated,
            "clip_frac_low": torch.zeros_like(truncated),
            "clip_frac_high": truncated,
        }
    return LossParts(loss, stats)
