"""Interface types of the objectives: the batch an objective sees, what it returns, and the callable wrapper.

An objective is one pure function `loss_fn(batch, config) -> LossParts` (tensors in, loss and stat tensors out).
`Objective` wraps it with input validation, padding sanitisation, the options every objective shares (the KL
penalty to the reference model), the diagnostics every objective reports, and the conversion of stats to floats;
it holds no state, logs nothing and does no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
from pydantic import BaseModel
from torch import Tensor

from heterorl.config import ObjectiveOptions
from heterorl.objectives.aggregation import aggregate
from heterorl.objectives.diagnostics import common_stats, to_floats
from heterorl.objectives.ref_kl import ref_kl


@dataclass(frozen=True)
class ObjectiveBatch:
    """Validated inputs of one objective call; B sequences of padded length T.

    Log-probs are replaced by 0 outside `mask` with `torch.where`, so garbage (even NaN or inf) on prompt and
    padding positions reaches neither the loss nor the gradient: the backward of `where` sends exactly 0 to the
    unselected positions, whereas multiplying by the mask would give 0 * NaN = NaN. Every reduction still uses
    `mask`; the zeros only keep the arithmetic on padding finite.
    """

    logp: Tensor  # [B, T] learner log-probs; the only input that carries a gradient
    behavior_logp: Tensor  # [B, T] sampler log-probs (detached)
    mask: Tensor  # [B, T] bool: True on completion tokens
    adv: Tensor  # [B] per-sequence advantages (detached, logp dtype)
    group_index: Tensor  # [B] int64 prompt id; equal for the completions of one prompt
    prox_logp: Tensor | None = None  # [B, T] log-probs at the start of the learner step (detached)
    ref_logp: Tensor | None = None  # [B, T] log-probs under the frozen reference model (detached)

    @property
    def log_ratio(self) -> Tensor:
        """[B, T] log(p/q) per token: learner minus behaviour log-prob; 0 on padding."""
        return self.logp - self.behavior_logp

    @property
    def anchor_logp(self) -> Tensor:
        """[B, T] the log-probs a capped objective's surrogate is taken against: prox_logp (docs/objectives.md)."""
        if self.prox_logp is None:
            raise ValueError("a behaviour-weight cap (cap_mode) needs prox_logp")
        return self.prox_logp

    @property
    def seq_valid(self) -> Tensor:
        """[B] bool: sequences with at least one completion token."""
        return self.mask.any(dim=-1)


class LossParts(NamedTuple):
    """What an objective function returns: the scalar loss and its own (detached, scalar) stat tensors."""

    loss: Tensor
    stats: dict[str, Tensor]


LossFn = Callable[[ObjectiveBatch, Any], LossParts]


@dataclass(frozen=True)
class ObjectiveOutput:
    """Result of an objective call: `loss` (scalar, differentiable w.r.t. logp) and float `stats`."""

    loss: Tensor
    stats: dict[str, float]


def _check_like(name: str, x: Tensor, ref: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.shape != ref.shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(ref.shape)} like logp")


def make_batch(
    *,
    logp: Tensor,
    behavior_logp: Tensor,
    mask: Tensor,
    advantages: Tensor,
    group_index: Tensor,
    prox_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
) -> ObjectiveBatch:
    """Validate shapes and dtypes, cast the mask to bool, and zero log-probs outside the mask (see ObjectiveBatch)."""
    if not isinstance(logp, Tensor) or logp.dim() != 2 or not logp.is_floating_point():
        raise ValueError("logp must be a floating-point tensor of shape [B, T]")
    B = logp.shape[0]
    _check_like("behavior_logp", behavior_logp, logp)
    _check_like("mask", mask, logp)
    if prox_logp is not None:
        _check_like("prox_logp", prox_logp, logp)
    if ref_logp is not None:
        _check_like("ref_logp", ref_logp, logp)
    if not isinstance(advantages, Tensor) or advantages.shape != (B,):
        raise ValueError(f"advantages must be a tensor of shape [{B}] (one per sequence)")
    if not isinstance(group_index, Tensor) or group_index.shape != (B,):
        raise ValueError(f"group_index must be a tensor of shape [{B}] (one per sequence)")
    if group_index.is_floating_point() or group_index.is_complex() or group_index.dtype == torch.bool:
        raise ValueError(f"group_index must be an integer tensor, got {group_index.dtype}")
    mask_BT = mask if mask.dtype == torch.bool else mask != 0
    if not bool(mask_BT.any()):
        raise ValueError("mask selects no completion tokens")

    def clean(x_BT: Tensor) -> Tensor:
        return torch.where(mask_BT, x_BT.to(logp.dtype), torch.zeros((), dtype=logp.dtype, device=logp.device))

    return ObjectiveBatch(
        logp=clean(logp),
        behavior_logp=clean(behavior_logp.detach()),
        mask=mask_BT,
        adv=advantages.detach().to(logp.dtype),
        group_index=group_index.long(),
        prox_logp=None if prox_logp is None else clean(prox_logp.detach()),
        ref_logp=None if ref_logp is None else clean(ref_logp.detach()),
    )


@dataclass(frozen=True)
class Objective:
    """A named objective: `objective(logp=..., behavior_logp=..., mask=..., advantages=..., group_index=...)`.

    Build it with `make_objective` or `objective_from_config`. `normalize_advantages` tells the learner how to call
    `group_advantages`; `needs_prox_logp` whether it must compute `prox_logp` (decoupled PPO, and any objective
    with a behaviour-weight cap); `needs_ref_logp` whether it must compute the reference model's `ref_logp`.
    """

    name: str
    config: BaseModel
    loss_fn: LossFn
    needs_prox_logp: bool = False

    @property
    def normalize_advantages(self) -> bool:
        return bool(self.config.normalize_advantages)  # type: ignore[attr-defined]

    @property
    def aggregation(self) -> str:
        """The token aggregation of the loss; the sequence-level objectives (gspo, gepo) are per-sequence means."""
        return str(getattr(self.config, "aggregation", "seq_mean_token_mean"))

    @property
    def needs_ref_logp(self) -> bool:
        return float(getattr(self.config, "ref_kl_beta", 0.0)) > 0

    def __call__(
        self,
        *,
        logp: Tensor,
        behavior_logp: Tensor,
        mask: Tensor,
        advantages: Tensor,
        group_index: Tensor,
        prox_logp: Tensor | None = None,
        ref_logp: Tensor | None = None,
    ) -> ObjectiveOutput:
        if self.needs_prox_logp and prox_logp is None:
            raise ValueError(f"objective {self.name!r} needs prox_logp (log-probs at the start of the learner step)")
        if self.needs_ref_logp and ref_logp is None:
            raise ValueError(f"objective {self.name!r} has ref_kl_beta > 0 and needs ref_logp (reference log-probs)")
        batch = make_batch(
            logp=logp,
            behavior_logp=behavior_logp,
            mask=mask,
            advantages=advantages,
            group_index=group_index,
            prox_logp=prox_logp,
            ref_logp=ref_logp if self.needs_ref_logp else None,
        )
        loss, own_stats = self.loss_fn(batch, self.config)
        if batch.ref_logp is not None:
            cfg = cast(ObjectiveOptions, self.config)
            kl_BT = ref_kl(batch.logp, batch.ref_logp, cfg.ref_kl_estimator)
            kl = aggregate(kl_BT, batch.mask, self.aggregation)  # type: ignore[arg-type]
            loss = loss + cfg.ref_kl_beta * kl
            own_stats = {**own_stats, "kl_ref": kl.detach()}
        with torch.no_grad():
            stats = {"loss": loss.detach(), **common_stats(batch), **own_stats}
            return ObjectiveOutput(loss=loss, stats=to_floats(stats))
