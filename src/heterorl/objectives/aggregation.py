"""Masked reductions and the three token-aggregation modes of a per-token loss.

The aggregation decides how much each token and each sequence weighs, which is a length bias:
- `seq_mean_token_mean` (GRPO paper): mean over the tokens of each sequence, then over the B sequences. Every
  sequence weighs the same, so a token of a long sequence weighs less; long wrong answers are penalised too little.
- `token_mean` (DAPO, AReaL): sum over all completion tokens / their number. Every token weighs the same; the
  normaliser still changes from batch to batch.
- `dr_grpo` (Dr.GRPO): sum over all completion tokens / (B * T), T the padded length of the [B, T] tensors. No
  length normalisation at all; a constant normaliser provided the caller pads to a fixed T.
Sequences without any completion token count in B but contribute 0.
All reductions use `torch.where(mask, x, 0)` rather than `x * mask` so that non-finite values off the mask cannot
leak in as 0 * inf = NaN.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from heterorl.config import Aggregation


def masked_sum(x_BT: Tensor, mask_BT: Tensor, dim: int | None = None) -> Tensor:
    """Sum of x over the True entries of mask (over all entries, or along `dim`)."""
    x_BT = torch.where(mask_BT, x_BT, torch.zeros((), dtype=x_BT.dtype, device=x_BT.device))
    return x_BT.sum() if dim is None else x_BT.sum(dim=dim)


def seq_mean(x_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """[B]: mean of x over each sequence's completion tokens (0 for a sequence without any)."""
    return masked_sum(x_BT, mask_BT, dim=-1) / mask_BT.sum(dim=-1).clamp(min=1)


def token_mean(x_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """Scalar: mean of x over all completion tokens of the batch."""
    return masked_sum(x_BT, mask_BT) / mask_BT.sum().clamp(min=1)


def seq_mean_token_mean(x_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """Scalar: mean over the B sequences of the per-sequence token mean."""
    return seq_mean(x_BT, mask_BT).mean()


def dr_grpo(x_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """Scalar: sum over completion tokens / (B * T), T the padded length."""
    return masked_sum(x_BT, mask_BT) / mask_BT.numel()


AGGREGATIONS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "seq_mean_token_mean": seq_mean_token_mean,
    "token_mean": token_mean,
    "dr_grpo": dr_grpo,
}


def aggregate(loss_BT: Tensor, mask_BT: Tensor, mode: Aggregation) -> Tensor:
    """Reduce a per-token loss to a scalar with one of the modes above."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; valid: {sorted(AGGREGATIONS)}")
    return AGGREGATIONS[mode](loss_BT, mask_BT)
