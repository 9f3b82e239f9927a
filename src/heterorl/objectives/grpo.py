"""GRPO: token-level importance ratio with the PPO clip (docs/objectives.md), optionally dual-clipped and with
a capped behaviour weight (TIS / MIS)."""

from __future__ import annotations

import torch

from heterorl.config import CappedObjective, GRPOConfig
from heterorl.objectives.aggregation import aggregate
from heterorl.objectives.base import LossParts, ObjectiveBatch
from heterorl.objectives.correction import maybe_correction
from heterorl.objectives.diagnostics import log_weight_stats
from heterorl.objectives.ratios import clip_fractions, clipped_surrogate, dual_clip_fraction


def token_ppo(
    batch: ObjectiveBatch,
    cfg: CappedObjective,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
    aggregation: str,
) -> LossParts:
    """The token-level PPO loss of GRPO and decoupled PPO.

    No cap:  rho_t = exp(logp_t - behavior_logp_t),  l_t = PPO(rho_t, A_i).
    A cap:   u_t = exp(logp_t - prox_logp_t),  l_t = w PPO(u_t, A_i),  w = capped sg(pi_prox / mu) per token or per
             sequence (heterorl.objectives.correction); dropped elements give 0 and keep their denominator.
    PPO(x, A) = -min(x A, clip(x, 1-eps_low, 1+eps_high) A), capped at c |A| for A < 0 with a dual clip c.
    Stats: weight stats of rho (no cap) or of the behaviour weights before the cap (with cap_frac*); clip and
    dual-clip fractions over the completion tokens that are not dropped.
    """
    correction = maybe_correction(batch, cfg)
    anchor_BT = batch.behavior_logp if correction is None else batch.anchor_logp
    log_ratio_BT = batch.logp - anchor_BT
    ratio_BT = torch.exp(log_ratio_BT)
    adv_B1 = batch.adv[:, None]
    loss_BT = clipped_surrogate(ratio_BT, adv_B1, eps_low, eps_high, dual_clip)
    kept_BT = batch.mask
    if correction is not None:
        loss_BT = correction.weight_BT * loss_BT
        kept_BT = correction.kept_BT
    loss = aggregate(loss_BT, batch.mask, aggregation)  # type: ignore[arg-type]  # the original mask's denominator
    with torch.no_grad():
        weight_stats = log_weight_stats(log_ratio_BT, batch.mask) if correction is None else correction.stats
        stats = {**weight_stats, **clip_fractions(ratio_BT, adv_B1, eps_low, eps_high, kept_BT)}
        if dual_clip is not None:
            stats["dual_clip_frac"] = dual_clip_fraction(ratio_BT, adv_B1, dual_clip, kept_BT)
    return LossParts(loss, stats)


def grpo(batch: ObjectiveBatch, cfg: GRPOConfig) -> LossParts:
    """rho_t = exp(logp_t - behavior_logp_t);  l_t = -min(rho_t A_i, clip(rho_t, 1-eps_low, 1+eps_high) A_i);
    loss = aggregate(l, cfg.aggregation).  Options: dual clip (A < 0: l_t = min(l_t, -c A_i)); a behaviour-weight
    cap (cap_mode clamp / mask): l_t = w PPO(exp(logp_t - prox_logp_t), A_i), w = capped sg(pi_prox / mu).

    Source: DeepSeekMath (GRPO, arXiv 2402.03300); eps_high > eps_low is DAPO's clip-higher; the aggregation modes
    cover GRPO (seq_mean_token_mean), DAPO (token_mean) and Dr.GRPO; dual clip: Ye et al. 2020 (arXiv 1912.09729);
    TIS: Yao et al. 2025 ("Your efficient RL framework secretly brings you off-policy RL training"); MIS: Liu, Li
    et al. 2025 ("When speed kills stability"), IcePop (Ling team 2025). Departures: the ratio is taken against the
    sampler's recorded log-probs (the behaviour policy, possibly many versions stale) rather than a fresh
    "old policy" forward pass; with a cap the surrogate is against the learner's own log-probs at the start of the
    step, which is how verl's and TRL's TIS compute it. Each token has its own denominator q_t, so without a cap
    or a dual clip a single badly mismatched token can carry a huge weight on the unclipped side (A < 0).
    Weight stats: the token ratios rho (no cap) or the behaviour weights before the cap.
    """
    return token_ppo(batch, cfg, cfg.eps_low, cfg.eps_high, cfg.dual_clip, cfg.aggregation)
