"""KL penalty to a frozen reference model (the run's base model), as TRL's `beta` and verl's `use_kl_loss`.

Per completion token, with d = ref_logp - logp = log(pi_ref / pi_theta) on the sampled token (Schulman's
"Approximating KL divergence" estimators of KL(pi_theta || pi_ref)):

    k1 = -d                    unbiased, can be negative; gradient grad logp (pushes every sampled token down)
    k2 = d^2 / 2               biased, >= 0; gradient (logp - ref_logp) grad logp
    k3 = exp(d) - d - 1        unbiased, >= 0 (TRL's GRPO, verl's low_var_kl); gradient (1 - pi_ref / pi) grad logp

The objective wrapper adds `ref_kl_beta * aggregate(k, mask)` to the loss with the objective's own aggregation
(seq_mean_token_mean for the sequence-level objectives), so micro-batch loss shares stay exact, and reports the
aggregated estimator as `kl_ref`. The samples come from the sampler, not pi_theta; as in TRL and verl this is
ignored. No clamp (verl clamps k3 to [-10, 10]): a token 88 nats less likely under pi_theta than under pi_ref
overflows float32, which is a run already lost.
"""

from __future__ import annotations

import torch
from torch import Tensor

from heterorl.config import KLEstimator


def ref_kl(logp_BT: Tensor, ref_logp_BT: Tensor, estimator: KLEstimator) -> Tensor:
    """[B, T] per-token estimator of KL(pi_theta || pi_ref); differentiable in logp, ref_logp is a constant."""
    d_BT = ref_logp_BT.detach() - logp_BT
    if estimator == "k1":
        return -d_BT
    if estimator == "k2":
        return 0.5 * d_BT**2
    if estimator == "k3":
        return torch.expm1(d_BT) - d_BT
    raise ValueError(f"unknown KL estimator {estimator!r}; valid: k1, k2, k3")
