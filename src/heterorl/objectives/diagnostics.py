"""Diagnostics every objective reports (docs/objectives.md): learner–sampler KL, importance-weight statistics,
clip and gate fractions. All are computed without gradient, in float64 where weights can be huge (a 50-nat gap is a
weight of 5e21, whose square overflows float32), and from log-weights where that avoids overflow altogether.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from heterorl.objectives.aggregation import token_mean

if TYPE_CHECKING:
    from heterorl.objectives.base import ObjectiveBatch

COMMON_STAT_KEYS = ("loss", "kl_k3", "kl_k1", "entropy_proxy", "advantage_abs_mean")
WEIGHT_STAT_KEYS = ("is_weight_mean", "is_weight_var", "is_weight_max", "ess")
CLIP_STAT_KEYS = ("clip_frac", "clip_frac_low", "clip_frac_high")
GATE_STAT_KEYS = ("gate_mean", "gate_frac_below_0.1", "gate_frac_above_0.9")
LOG_WEIGHT_SATURATION = 700.0  # exp(700) ~ 1e304 < float64's max ~ 1.8e308


def k3(log_ratio: Tensor) -> Tensor:
    """Elementwise k3 estimator r - 1 - log r with log r given; >= 0, and exact near r = 1 thanks to expm1."""
    return torch.expm1(log_ratio) - log_ratio


def masked_fraction(cond: Tensor, valid: Tensor) -> Tensor:
    """Share of `valid` elements where `cond` holds (float64 scalar)."""
    return (cond & valid).sum(dtype=torch.float64) / valid.sum().clamp(min=1)


def log_weight_stats(log_w: Tensor, valid: Tensor) -> dict[str, Tensor]:
    """Mean, population variance, max and ESS of the weights exp(log_w) over `valid` elements.

    ESS = (sum w)^2 / (n sum w^2) in (0, 1], 1 when all weights are equal; computed as
    exp(2 lse(log w) - lse(2 log w) - log n) so it stays exact whatever the magnitude of the weights. Mean and
    variance saturate weights at e^700 (an exact sequence ratio can reach e^1000), so they are inf at worst,
    never inf - inf = NaN.
    """
    log_w = log_w.detach().double()
    n = valid.sum().clamp(min=1).double()
    neg_inf = torch.tensor(-torch.inf, dtype=torch.float64, device=log_w.device)
    w = torch.where(valid, log_w.clamp(max=LOG_WEIGHT_SATURATION).exp(), 0.0)
    mean = w.sum() / n
    var = torch.where(valid, (w - mean) ** 2, 0.0).sum() / n
    log_w_valid = torch.where(valid, log_w, neg_inf)
    ess = torch.exp(2 * torch.logsumexp(log_w_valid.flatten(), 0) - torch.logsumexp(2 * log_w_valid.flatten(), 0)) / n
    return {
        "is_weight_mean": mean,
        "is_weight_var": var,
        "is_weight_max": log_w_valid.max().exp(),
        "ess": ess,
    }


def token_ratio_weight_stats(batch: ObjectiveBatch) -> dict[str, Tensor]:
    """Weight stats of the token ratio p/q, for objectives without weights of their own (pg, dg)."""
    return log_weight_stats(batch.log_ratio, batch.mask)


def common_stats(batch: ObjectiveBatch) -> dict[str, Tensor]:
    """kl_k3, kl_k1 (token means over completion tokens), entropy_proxy (mean surprisal), advantage_abs_mean."""
    log_ratio_BT = batch.log_ratio.detach().double()
    return {
        "kl_k3": token_mean(k3(log_ratio_BT), batch.mask),
        "kl_k1": token_mean(-log_ratio_BT, batch.mask),
        "entropy_proxy": token_mean(-batch.logp.detach().double(), batch.mask),
        "advantage_abs_mean": batch.adv.abs().double().mean(),
    }


def to_floats(stats: dict[str, Tensor]) -> dict[str, float]:
    """Scalar stat tensors -> Python floats with one device sync."""
    values = torch.stack([v.detach().double().reshape(()) for v in stats.values()]).tolist()
    return dict(zip(stats.keys(), values, strict=True))
