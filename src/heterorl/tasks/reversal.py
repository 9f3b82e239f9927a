"""`s=` -> s reversed: the token-reversal task of the Delightful Policy Gradient papers."""

from __future__ import annotations

import random

from heterorl.config import ReversalTaskConfig
from heterorl.tasks.base import Problem, Task, exact_match


class ReversalTask(Task):
    """Strings of uniform length in [min_length, max_length] over `alphabet`; reward 1 for the exact reversal."""

    name = "reversal"
    recognises_prompts = True

    def __init__(self, cfg: ReversalTaskConfig) -> None:
        super().__init__(cfg.eval_size)
        self.alphabet = cfg.alphabet
        self.min_length, self.max_length = cfg.min_length, cfg.max_length

    @property
    def max_problems(self) -> int:
        k = len(self.alphabet)
        return sum(k**n for n in range(self.min_length, self.max_length + 1))

    def _draw(self, rng: random.Random) -> Problem:
        n = rng.randint(self.min_length, self.max_length)
        s = "".join(rng.choice(self.alphabet) for _ in range(n))
        return Problem(prompt=f"{s}=", answer=s[::-1])

    def problem_for(self, prompt: str) -> Problem | None:
        s = prompt[:-1]
        if not prompt.endswith("=") or not self.min_length <= len(s) <= self.max_length:
            return None
        if any(c not in self.alphabet for c in s) or prompt in self._held_out_prompts():
            return None
        return Problem(prompt=prompt, answer=s[::-1])

    def verify(self, problem: Problem, completion: str) -> float:
        return exact_match(problem, completion)
