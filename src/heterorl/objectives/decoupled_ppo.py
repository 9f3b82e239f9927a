"""AReaL's decoupled PPO: clip against the proximal policy, weight by the capped behaviour ratio (section 6)."""

from __future__ import annotations

from heterorl.config import DecoupledPPOConfig
from heterorl.objectives.base import LossParts, ObjectiveBatch
from heterorl.objectives.grpo import token_ppo


def decoupled_ppo(batch: ObjectiveBatch, cfg: DecoupledPPOConfig) -> LossParts:
    """u_t = exp(logp_t - prox_logp_t);  b_t = sg(exp(prox_logp_t - behavior_logp_t));
    l_t = b_t * -min(u_t A_i, clip(u_t, 1-eps, 1+eps_high) A_i);  loss = aggregate(l, cfg.aggregation).
    cap_mode "mask": elements with b outside [cap_low, cap] (default cap_low 0: above cap only) contribute 0 but
    still count in the denominator (the ORIGINAL mask's token count); "clamp": b = min(b, cap) (truncated IS).
    cap_level token (AReaL), sequence or geometric computes one b per sequence; dual_clip caps l_t at b c |A|.

    Source: AReaL (arXiv 2505.24298) and its repo. Why: the trust region is taken around the proximal policy
    (the learner's parameters at the start of the step), which the learner can compute, while the staleness of
    the sampler is corrected by the behaviour weight b; the cap bounds its variance. With one optimizer step per
    batch u = 1 (with gradient) and this is PG with capped IS. It is GRPO with a mandatory cap (`token_ppo`).
    Departures: none at the defaults (eps_high None = eps; sequence levels, cap_low and dual clip are options).
    Weight stats: the behaviour weights b before the cap; clip stats: u over the tokens that are not dropped.
    """
    eps_high = cfg.eps if cfg.eps_high is None else cfg.eps_high
    return token_ppo(batch, cfg, cfg.eps, eps_high, cfg.dual_clip, cfg.aggregation)
