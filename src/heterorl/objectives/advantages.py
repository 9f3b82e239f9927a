"""Group-relative advantages (docs/objectives.md)."""

from __future__ import annotations

import torch
from torch import Tensor

from heterorl.objectives.groups import dense_group_ids, group_count, group_min, group_sum

GROUP_STD_EPS = 1e-4  # added to the group std (not the variance), as in GRPO implementations


def group_advantages(rewards_B: Tensor, group_index_B: Tensor, normalize: bool) -> Tensor:
    """A_i = r_i - mean_group(r); with `normalize`, divided by (std_group(r) + 1e-4).

    - std is the UNBIASED sample std (divisor n - 1, torch's default, as in TRL's GRPO); a group of one
      completion has std 0 and advantage 0.
    - Groups may have different sizes and arbitrary integer ids in any order; everything is one scatter pass.
    - Each group is shifted by its minimum before averaging, so a group of equal rewards gets advantages that are
      exactly 0 (r - mean(r) in floating point can leave ~1e-8, which the std division would blow up to ~1e-4).
    Integer or bool rewards are promoted to the default float dtype; the result has the rewards' float dtype.
    """
    if rewards_B.dim() != 1 or group_index_B.shape != rewards_B.shape:
        raise ValueError(
            f"rewards and group_index must both be [B]; got {tuple(rewards_B.shape)} and {tuple(group_index_B.shape)}"
        )
    r_B = rewards_B if rewards_B.is_floating_point() else rewards_B.to(torch.get_default_dtype())
    ids_B, G = dense_group_ids(group_index_B)
    count_G = group_count(ids_B, G, r_B.dtype)
    shifted_B = r_B - group_min(r_B, ids_B, G)[ids_B]
    adv_B = shifted_B - (group_sum(shifted_B, ids_B, G) / count_G)[ids_B]
    if normalize:
        var_G = group_sum(adv_B**2, ids_B, G) / (count_G - 1).clamp(min=1)
        adv_B = adv_B / (var_G.sqrt() + GROUP_STD_EPS)[ids_B]
    return adv_B
