"""Held-out greedy evaluation: the share of evaluation prompts whose greedy completion the verifier accepts."""

from __future__ import annotations

from heterorl.policy import Policy
from heterorl.tasks import Problem, Task


def greedy_accuracy(policy: Policy, task: Task, problems: list[Problem], max_new_tokens: int) -> float:
    """Share of greedy completions the task's own verifier accepts (0..1), whatever reward trains the policy."""
    if not problems:
        raise ValueError("no evaluation problems")
    texts = policy.greedy_completions([p.prompt for p in problems], max_new_tokens)
    return sum(task.verify(p, t) for p, t in zip(problems, texts, strict=True)) / len(problems)
