"""Importance ratios and the PPO clipped surrogate, shared by GRPO, GSPO, GEPO and decoupled PPO.

A ratio may be per token ([B, T], GRPO), per sequence ([B], GSPO, GEPO) or against the proximal policy (decoupled
PPO); the surrogate and its clip statistics do not care, the advantage only has to broadcast against the ratio.
"""

from __future__ import annotations

import torch
from torch import Tensor

from heterorl.objectives.diagnostics import masked_fraction


def clipped_surrogate(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """Elementwise PPO loss -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A).

    The min is pessimistic: the clip only removes the incentive to move the ratio further in the direction the
    advantage rewards (above 1 + eps_high when A > 0, below 1 - eps_low when A < 0); there the gradient is 0.
    The other side is unbounded, as in PPO.
    """
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return -torch.minimum(ratio * adv, clipped * adv)


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
