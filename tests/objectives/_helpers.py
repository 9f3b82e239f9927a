"""Shared test helpers: run an objective on small float64 lists and return loss, gradient and stats."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from heterorl.objectives import Objective

Matrix = list[list[float]]


@dataclass
class Result:
    loss: float
    grad: Matrix  # d loss / d logp, [B][T]
    stats: dict[str, float]


def run(
    objective: Objective,
    logp: Matrix,
    behavior_logp: Matrix,
    mask: list[list[int]],
    advantages: list[float],
    group_index: list[int] | None = None,
    prox_logp: Matrix | None = None,
    ref_logp: Matrix | None = None,
) -> Result:
    logp_BT = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    out = objective(
        logp=logp_BT,
        behavior_logp=torch.tensor(behavior_logp, dtype=torch.float64),
        mask=torch.tensor(mask, dtype=torch.bool),
        advantages=torch.tensor(advantages, dtype=torch.float64),
        group_index=torch.tensor(group_index if group_index is not None else list(range(len(logp)))),
        prox_logp=None if prox_logp is None else torch.tensor(prox_logp, dtype=torch.float64),
        ref_logp=None if ref_logp is None else torch.tensor(ref_logp, dtype=torch.float64),
    )
    (grad,) = torch.autograd.grad(out.loss, logp_BT)
    return Result(out.loss.item(), grad.tolist(), out.stats)


def assert_close(actual: Matrix | list[float] | float, expected: Matrix | list[float] | float, tol: float = 1e-10):
    torch.testing.assert_close(
        torch.tensor(actual, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64), rtol=tol, atol=tol
    )
