"""AReaL's dynamic batching: split a minibatch into micro-batches of whole groups under a token budget.

Gradients are accumulated over micro-batches with each micro-batch's loss scaled by its share of the
minibatch's normaliser, so the accumulated gradient equals the full minibatch's for every aggregation:

    per-sequence means (seq_mean_token_mean, gspo, gepo):  share = B_micro / B
    token_mean:                                            share = tokens_micro / tokens
    dr_grpo (sum / (B * L)):                               share = B_micro / B, micro-batches keep the width L

Groups are never split, because GEPO's group expectation and the advantages are per group.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from heterorl.rollout import Batch


def split_by_tokens(batch: Batch, rows_B: torch.Tensor, budget: int | None) -> list[torch.Tensor]:
    """Row sets of whole groups, each under `budget` tokens (prompt + completion; a larger group stands alone).

    First-fit decreasing over groups sorted by size, so micro-batches are few and similar (AReaL packs sequences
    sorted by length the same way). `budget=None` keeps the rows together.
    """
    if budget is None:
        return [rows_B]
    tokens_B = batch.prompt_mask_BP.sum(1) + batch.completion_mask_BL.sum(1)
    groups = batch.group_index_B[rows_B]
    ids, inverse = torch.unique(groups, return_inverse=True)
    sizes = torch.zeros(len(ids), dtype=torch.long, device=tokens_B.device).index_add_(0, inverse, tokens_B[rows_B])
    bins: list[list[int]] = []
    loads: list[int] = []
    for g in sorted(range(len(ids)), key=lambda i: (-int(sizes[i]), i)):  # a loop over groups, not elements
        size = int(sizes[g])
        target = next((b for b, load in enumerate(loads) if load + size <= budget), None)
        if target is None:
            bins.append([g])
            loads.append(size)
        else:
            bins[target].append(g)
            loads[target] += size
    return [rows_B[torch.isin(inverse, torch.tensor(b, device=inverse.device))] for b in bins]


def loss_share(aggregation: str, loss_mask_BL: torch.Tensor, micro_rows: torch.Tensor, rows: torch.Tensor) -> float:
    """The factor that makes the micro-batch's loss a term of the minibatch's loss (module docstring); token counts
    are those of the loss mask the objective sees (completion tokens, less any masked truncated completions)."""
    if aggregation == "token_mean":
        return float(loss_mask_BL[micro_rows].sum()) / float(loss_mask_BL[rows].sum())
    return len(micro_rows) / len(rows)


class StatsAccumulator:
    """Share-weighted means of micro-batch statistics; `*_max` statistics take the maximum."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.weights: dict[str, float] = defaultdict(float)

    def add(self, stats: dict[str, float], weight: float = 1.0) -> None:
        for key, value in stats.items():
            if key.endswith("_max"):
                self.sums[key] = max(self.sums.get(key, value), value)
                self.weights[key] = 1.0
            else:
                self.sums[key] += weight * value
                self.weights[key] += weight

    def result(self) -> dict[str, float]:
        return {k: v / self.weights[k] if self.weights[k] else v for k, v in self.sums.items()}
