"""Truncated completions: their detection, the loss mask that drops them, and DAPO's soft overlong penalty.

Both are options of every objective (`mask_truncated`, `overlong_cache`) applied by the learner, which alone
sees completion ids and the end-of-sequence id:
- masking is a loss mask: a truncated completion still counts in its group's advantages (its reward is real) but
  contributes no loss term (DAPO's "overlong filtering", TRL's `mask_truncated_completions`);
- the soft overlong penalty is reward shaping: it is added to the rewards before the group advantages
  (DAPO eq. 13; verl's overlong buffer in its DAPO reward manager).
"""

from __future__ import annotations

import torch
from torch import Tensor


def truncated_completions(completion_ids_BL: Tensor, completion_mask_BL: Tensor, eos_id: int) -> Tensor:
    """[B] bool: completions whose mask holds no end-of-sequence token (cut at max_new_tokens)."""
    return ~((completion_ids_BL == eos_id) & completion_mask_BL.bool()).any(dim=-1)


def overlong_penalty(length_B: Tensor, max_len: int, cache: int, factor: float = 1.0) -> Tensor:
    """[B] DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13), times `factor`:

        0                                  if L <= max_len - cache
        ((max_len - cache) - L) / cache    if max_len - cache < L <= max_len   (from 0 down to -1)
        -1                                 if L > max_len

    L is the number of completion tokens (end-of-sequence included, as verl counts it); max_len is the generation
    limit, so the last case only arises if a completion is longer than the sampler's limit.
    """
    if not 0 < cache <= max_len:
        raise ValueError(f"overlong cache {cache} must be in [1, max_len = {max_len}]")
    length_B = length_B.to(torch.get_default_dtype())
    ramp_B = (((max_len - cache) - length_B) / cache).clamp(max=0.0)
    return factor * torch.where(length_B > max_len, -1.0, ramp_B)
