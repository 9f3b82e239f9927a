"""Importance ratios and the PPO clipped surrogate, shared by GRPO, GSPO, GEPO and decoupled PPO.

A ratio may be per token ([B, T], GRPO), per sequence ([B], GSPO, GEPO) or against the proximal policy (decoupled
PPO); the surrogate and its clip statistics do not care, the advantage only has to broadcast against the ratio.
"""

from __future__ import annotations

import torch
from torch import Tensor

from heterorl.objectives.diagnostics import masked_fraction


def clipped_surrogate(
    ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float, dual_clip: float | None = None
) -> Tensor:
    """Elementwise PPO loss -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A).

    The min is pessimistic: the clip only removes the incentive to move the ratio further in the direction the
    advantage rewards (above 1 + eps_high when A > 0, below 1 - eps_low when A < 0); there the gradient is 0.
    The other side is unbounded, as in PPO, unless `dual_clip` = c > 1 (Ye et al. 2020, "Mastering Complex Control
    in MOBA Games with Deep RL"): for A < 0 the objective is max(min(ratio A, clip(ratio) A), c A), i.e. the loss
    is capped at -c A = c |A|, and a ratio above c (a stale or mismatched token the learner now likes much more)
    contributes no gradient instead of an unbounded one.
    """
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = -torch.minimum(ratio * adv, clipped * adv)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip * adv), loss)
    return loss


def dual_clip_fraction(ratio: Tensor, adv: Tensor, dual_clip: float, valid: Tensor) -> Tensor:
    """Share of valid elements where the dual clip is active: A < 0 and ratio > c (gradient zeroed)."""
    ratio, adv = torch.broadcast_tensors(ratio.detach(), adv.detach())
    return masked_fraction((adv < 0) & (ratio > dual_clip), valid)


def token_form(seq_ratio_B: Tensor, logp_BT: Tensor) -> Tensor:
    """[B, T]: the sequence ratio on every token with gradient seq_ratio_i * grad logp_t (the GSPO paper's
    GSPO-token form). Aggregated with seq_mean_token_mean, PPO(token_form(s), A) has GSPO's value and gradient,
    which lets a per-token weight (a token-level behaviour weight) scale each token's term of a sequence-level
    objective.
    Requires d seq_ratio_i / d logp_t = seq_ratio_i / n_i, true of exp(mean_t logp_t - constant).
    """
    return seq_ratio_B.detach()[:, None] * torch.exp(logp_BT - logp_BT.detach())


def clip_fractions(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float, valid: Tensor) -> dict[str, Tensor]:
    """Share of valid elements where the clip is active (gradient zeroed), split by side (as in TRL).

    low: ratio < 1 - eps_low and A < 0; high: ratio > 1 + eps_high and A > 0; clip_frac = low + high.
    """
    ratio, adv = torch.broadcast_tensors(ratio.detach(), adv.detach())
    low = (ratio < 1.0 - eps_low) & (adv < 0)
    high = (ratio > 1.0 + eps_high) & (adv > 0)
    return {
        "clip_frac": masked_fraction(low | high, valid),
        "clip_frac_low": masked_fraction(low, valid),
        "clip_frac_high": masked_fraction(high, valid),
    }
