"""Behaviour-weight correction: truncated (TIS) or masked (MIS / IcePop) importance weights pi_prox / mu.

The sampler's log-probs mu come from another kernel stack (vLLM, bf16 weights) and usually an older weight version
than the learner's; heterorl's learner cannot recompute log-probs at that version. What it can compute is pi_prox,
its own fp32 forward pass at the start of the step (no grad). The correction therefore follows AReaL's decoupling
(and verl's "decoupled" rollout correction): the surrogate is taken against pi_prox (trust region, clip), and the
gap from mu to pi_prox, which at staleness 0 is exactly the train–inference mismatch, is corrected by the
stop-gradient behaviour weight w = pi_prox / mu, bounded:

    clamp (TIS):  w -> min(w, cap)                                      (Yao et al. 2025; verl, TRL)
    mask  (MIS):  w -> w * 1[cap_low <= w <= cap], cap_low = 1/cap by default   (Liu, Li et al. 2025; IcePop)

at one of three levels: token (w_t), sequence (prod_t w_t, the exact sequence ratio) or geometric
(exp(mean_t log w_t), GSPO's length-normalised scale), a sequence weight applying to every token of its sequence.
Masked elements contribute 0 but keep their place in the aggregation's denominator (AReaL's convention; verl
removes them from it), which keeps dynamic batching exact with the ordinary loss shares.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor

from heterorl.config import CappedObjective
from heterorl.objectives.aggregation import masked_sum, seq_mean
from heterorl.objectives.diagnostics import log_weight_stats, masked_fraction

if TYPE_CHECKING:
    from heterorl.objectives.base import ObjectiveBatch


class Correction(NamedTuple):
    """The bounded behaviour weights of one batch and their diagnostics."""

    weight_BT: Tensor  # detached weight per token (a sequence weight repeated on its tokens); 0 where dropped
    kept_BT: Tensor  # bool: completion tokens that were not dropped by the mask
    stats: dict[str, Tensor]  # is_weight_* / ess of the weights before the cap, cap_frac, cap_frac_low, cap_frac_high


def _log_bound(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def behaviour_correction(
    prox_logp_BT: Tensor, behavior_logp_BT: Tensor, mask_BT: Tensor, cfg: CappedObjective
) -> Correction:
    """w = pi_prox / mu at `cfg.cap_level`, truncated or masked by `cfg.cap_mode` (module docstring).

    Log-probs must be 0 off the mask (as `make_batch` leaves them). Bounds are compared in log space, so a weight
    of e^1000 is dropped or truncated without ever being formed.
    """
    assert cfg.cap_mode != "none", "no correction requested"
    log_w_BT = (prox_logp_BT - behavior_logp_BT).detach()
    if cfg.cap_level == "token":
        log_w, valid = log_w_BT, mask_BT  # [B, T]
    else:
        valid = mask_BT.any(dim=-1)  # [B]
        log_w = masked_sum(log_w_BT, mask_BT, dim=-1) if cfg.cap_level == "sequence" else seq_mean(log_w_BT, mask_BT)
    log_high, log_low = _log_bound(cfg.cap), _log_bound(cfg.cap_lower_bound)
    high, low = log_w > log_high, log_w < log_low
    if cfg.cap_mode == "clamp":
        dropped = torch.zeros_like(high)
        weight = torch.exp(log_w.clamp(max=log_high))
    else:
        dropped = high | low
        weight = torch.where(dropped, 0.0, torch.exp(torch.where(dropped, 0.0, log_w)))
    stats = {
        **log_weight_stats(log_w, valid),
        "cap_frac": masked_fraction(high | low, valid),
        "cap_frac_low": masked_fraction(low, valid),
        "cap_frac_high": masked_fraction(high, valid),
    }
    if cfg.cap_level != "token":  # one weight per sequence, repeated on its tokens
        weight, dropped = weight[:, None].expand_as(mask_BT), dropped[:, None].expand_as(mask_BT)
    return Correction(weight_BT=weight, kept_BT=mask_BT & ~dropped, stats=stats)


def maybe_correction(batch: ObjectiveBatch, cfg: CappedObjective) -> Correction | None:
    """The batch's behaviour correction, or None when `cfg.cap_mode` is "none" (the surrogate then stays against
    the sampler's log-probs, the objective's published form)."""
    if cfg.cap_mode == "none":
        return None
    return behaviour_correction(batch.anchor_logp, batch.behavior_logp, batch.mask, cfg)
