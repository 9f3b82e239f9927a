"""Vectorised per-group reductions over a batch of sequences (no Python loop over groups).

Groups are the completions of one prompt, identified by arbitrary integer ids in any order; `dense_group_ids`
maps them to 0..G-1 so that the reductions are a single `index_add` / `scatter_reduce` each.
"""

from __future__ import annotations

import torch
from torch import Tensor


def dense_group_ids(group_index_B: Tensor) -> tuple[Tensor, int]:
    """Arbitrary integer ids [B] -> (ids in 0..G-1 [B], G); ids follow the sorted order of the originals."""
    unique_G, ids_B = torch.unique(group_index_B, return_inverse=True)
    return ids_B, unique_G.numel()


def group_sum(x_B: Tensor, ids_B: Tensor, G: int) -> Tensor:
    """[G]: sum of x over each group."""
    return x_B.new_zeros(G).index_add(0, ids_B, x_B)


def group_count(ids_B: Tensor, G: int, dtype: torch.dtype) -> Tensor:
    """[G]: number of members of each group."""
    return torch.bincount(ids_B, minlength=G).to(dtype)


def group_min(x_B: Tensor, ids_B: Tensor, G: int) -> Tensor:
    """[G]: minimum of x over each group."""
    return x_B.new_full((G,), torch.inf).scatter_reduce(0, ids_B, x_B, reduce="amin", include_self=True)


def group_max(x_B: Tensor, ids_B: Tensor, G: int) -> Tensor:
    """[G]: maximum of x over each group."""
    return x_B.new_full((G,), -torch.inf).scatter_reduce(0, ids_B, x_B, reduce="amax", include_self=True)


def group_logsumexp(x_B: Tensor, ids_B: Tensor, G: int) -> Tensor:
    """[G]: log sum_j exp(x_j) over each group, stable for any magnitude (the group max is subtracted first).

    The max is detached: logsumexp does not depend on the shift, so its gradient flows through the exp term only.
    A group whose entries are all -inf gets -inf (the shift is then 0 instead of -inf, which would give NaN).
    """
    max_G = group_max(x_B, ids_B, G).detach()
    max_G = torch.where(torch.isfinite(max_G), max_G, 0.0)
    return max_G + torch.log(group_sum(torch.exp(x_B - max_G[ids_B]), ids_B, G))
