"""Which micro-batches of a learner step this process computes, and how its gradients meet the other processes'.

One process (`Sharding`) computes every micro-batch of a minibatch: today's dynamic batching
(heterorl.microbatch). With N processes (`heterorl.parallel.ranks.RankSharding` implements the hooks with
torch.distributed), every rank packs the WHOLE batch, so rewards, advantages (per group), the loss mask and the
minibatch normalisers are the global ones; `plan_micro_batches` then gives each rank whole groups of every
minibatch (largest first to the least-loaded rank, by tokens) and cuts each rank's share into micro-batches by the
same token rule. Each micro-batch's loss is scaled by its share of the GLOBAL minibatch normaliser
(`microbatch.loss_share`), so the sum over ranks of the accumulated gradients is the single-process gradient.

Every rank must issue the same collectives in the same order (FSDP2 all-gathers in every forward, DDP and FSDP2
reduce in the last backward of a minibatch), so ranks with fewer micro-batches than the busiest one run
stand-ins: a forward and a zero-weight backward of one real row, whose gradient is exactly zero.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from heterorl.microbatch import StatsAccumulator, split_by_tokens
from heterorl.rollout import Batch, RolloutGroup


@dataclass(frozen=True)
class Micro:
    """One micro-batch slot of a minibatch on this process."""

    rows_B: torch.Tensor  # rows of the packed batch
    live: bool  # False: a stand-in that only keeps this rank's collectives in step (zero gradient, no stats)
    last: bool  # the minibatch's last slot: gradients are synchronised across ranks in its backward


def split_groups(batch: Batch, rows_B: torch.Tensor, world: int) -> list[torch.Tensor]:
    """The rows of `rows_B` dealt to `world` ranks by whole groups: largest group (tokens) first to the least-loaded
    rank, ties to the lower group and rank index, so every rank computes the same deal."""
    tokens_B = batch.prompt_mask_BP.sum(1) + batch.completion_mask_BL.sum(1)
    ids, inverse = torch.unique(batch.group_index_B[rows_B], return_inverse=True)
    sizes = torch.zeros(len(ids), dtype=torch.long, device=tokens_B.device).index_add_(0, inverse, tokens_B[rows_B])
    loads = [0] * world
    owned: list[list[int]] = [[] for _ in range(world)]
    for g in sorted(range(len(ids)), key=lambda i: (-int(sizes[i]), i)):  # a loop over groups, not elements
        rank = min(range(world), key=lambda r: (loads[r], r))
        owned[rank].append(g)
        loads[rank] += int(sizes[g])
    return [rows_B[torch.isin(inverse, torch.tensor(o, dtype=torch.long, device=inverse.device))] for o in owned]


def plan_micro_batches(
    batch: Batch, rows_B: torch.Tensor, budget: int | None, loss_mask_BL: torch.Tensor, rank: int, world: int
) -> list[Micro]:
    """Rank `rank`'s micro-batch slots of the minibatch `rows_B`, padded with stand-ins to the busiest rank's count.

    Micro-batches without a loss token (every completion masked as truncated) are dropped, as one process does.
    """
    shares = [
        [m for m in split_by_tokens(batch, rows, budget) if bool(loss_mask_BL[m].any())]
        for rows in split_groups(batch, rows_B, world)
    ]
    slots = max(len(s) for s in shares)
    mine = shares[rank]
    if len(mine) < slots:  # a stand-in row that has loss tokens, so its forward is an ordinary one
        first = next(s[0] for s in shares if s)
        stand_in = first[loss_mask_BL[first].any(dim=1)][:1]
        mine = mine + [stand_in] * (slots - len(mine))
    live = len(shares[rank])
    return [Micro(rows, i < live, i == slots - 1) for i, rows in enumerate(mine)]


class Sharding:
    """One process: every micro-batch is ours, nothing to synchronise. The base of the multi-process hooks."""

    rank = 0
    world = 1
    grad_scale = 1.0  # DDP and FSDP2 average gradients over ranks; the loss is scaled back to a sum
    leader = True

    def begin_step(self, groups: list[RolloutGroup]) -> list[RolloutGroup]:
        """The step's groups (rank 0 of several first sends them to the other ranks)."""
        return groups

    def micro_batches(
        self, batch: Batch, rows_B: torch.Tensor, budget: int | None, loss_mask_BL: torch.Tensor
    ) -> list[Micro]:
        micros = [m for m in split_by_tokens(batch, rows_B, budget) if bool(loss_mask_BL[m].any())]
        return [Micro(m, True, i == len(micros) - 1) for i, m in enumerate(micros)]

    def local_rows(self, batch: Batch, loss_mask_BL: torch.Tensor) -> torch.Tensor | None:
        """Rows whose proximal log-probs this process needs (None: every row)."""
        return None

    def accumulating(self, last: bool) -> AbstractContextManager[Any]:
        """Context of one micro-batch's forward and backward: synchronise gradients only when `last`."""
        return nullcontext()

    def clip_grad_norm(self, params: Iterable[torch.nn.Parameter], max_norm: float) -> float:
        """Clip the global gradient norm; returns it before clipping."""
        norm = torch.nn.utils.clip_grad_norm_(list(params), max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # a DTensor under FSDP2

    def reduce_stats(self, acc: StatsAccumulator) -> StatsAccumulator:
        """The step's statistics over every process."""
        return acc

    def end_step(self) -> None:
        """After the optimizer step (FSDP2: rank 0's full copy of the weights is refreshed)."""

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The full optimizer state in the single-process layout (what a durable state stores)."""
        return optimizer.state_dict()
