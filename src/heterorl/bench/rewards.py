"""Rewards for benchmarks (`task.reward: "heterorl.bench.rewards:NAME"`).

`partial_answer`: a dense reward for step benchmarks on untrained models. The task's verifier gives an untrained
model 0 on every completion, so every group's advantages are 0 and a step's gradient is only weight decay; with
partial credit most groups have spread and the learner takes real optimizer steps, as it does in a run.
"""

from __future__ import annotations


def partial_answer(prompt: str, completion: str, answer: str, **info: object) -> float:
    """Share of the answer's characters that the completion has at the same place (0 .. 1), plus a tenth of the
    share of digits in the completion (so that even a completion with nothing right carries a little signal)."""
    text = completion.strip()
    matched = sum(a == b for a, b in zip(text, answer, strict=False)) / max(len(answer), 1)
    digits = sum(c.isdigit() for c in text) / max(len(text), 1)
    return matched + 0.1 * digits
