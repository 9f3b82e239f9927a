"""Delightful Policy Gradient: gate each token by its "delight" A * surprisal (docs/objectives.md)."""

from __future__ import annotations

import torch
from torch import Tensor

from heterorl.config import DGConfig
from heterorl.objectives.aggregation import aggregate, token_mean
from heterorl.objectives.base import LossParts, ObjectiveBatch
from heterorl.objectives.diagnostics import masked_fraction, token_ratio_weight_stats


def delight_gate(chi: Tensor, eta: float, lam: float) -> Tensor:
    """w = sigmoid((chi - lam) / eta); eta = 0 is the hard gate 1[chi > lam] (as a float)."""
    if eta == 0:
        return (chi > lam).to(chi.dtype)
    return torch.sigmoid((chi - lam) / eta)


def dg(batch: ObjectiveBatch, cfg: DGConfig) -> LossParts:
    """l_t = -sg(logp_t) (surprisal under the CURRENT policy);  chi_t = A_i l_t;  w_t = sigmoid((chi_t - lam) / eta);
    loss = aggregate(-sg(w_t A_i) logp_t, cfg.aggregation).

    Source: Delightful PG (arXiv 2603.14608) and Delightful Distributed PG (arXiv 2603.20521), author's code
    plugyawn/egg. Why: a rare failure (A < 0, large surprisal) is most likely an actor bug or a stale sample and
    is gated out (w -> 0), while a rare success is a discovery and kept (w -> 1); no behaviour log-probs, no ratio,
    no clip, so stale or mismatched samplers cannot blow up a weight. The loss ignores behavior_logp entirely.
    Departures: none; the aggregation is a setting (the paper's masked mean is seq_mean_token_mean).
    Weight stats (diagnostic only): the token ratio p/q, so the learner–sampler mismatch stays visible.
    """
    mask_BT = batch.mask
    adv_B1 = batch.adv[:, None]
    surprisal_BT = -batch.logp.detach()
    gate_BT = delight_gate(adv_B1 * surprisal_BT, cfg.eta, cfg.lam)
    loss_BT = -(gate_BT * adv_B1) * batch.logp
    loss = aggregate(loss_BT, mask_BT, cfg.aggregation)
    with torch.no_grad():
        stats = {
            **token_ratio_weight_stats(batch),
            "gate_mean": token_mean(gate_BT.double(), mask_BT),
            "gate_frac_below_0.1": masked_fraction(gate_BT < 0.1, mask_BT),
            "gate_frac_above_0.9": masked_fraction(gate_BT > 0.9, mask_BT),
        }
    return LossParts(loss, stats)
