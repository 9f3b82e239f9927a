"""`a+b=` -> a+b in decimal: a procedural task with an exact verifier."""

from __future__ import annotations

import random

from heterorl.config import AdditionTaskConfig
from heterorl.tasks.base import Problem, Task, exact_match


class AdditionTask(Task):
    """Operands are uniform in [0, 10**digits); the answer is the sum without leading zeros."""

    name = "addition"

    def __init__(self, cfg: AdditionTaskConfig) -> None:
        super().__init__(cfg.eval_size)
        self.digits = cfg.digits

    @property
    def max_problems(self) -> int:
        return 10 ** (2 * self.digits)

    def _draw(self, rng: random.Random) -> Problem:
        a, b = rng.randrange(10**self.digits), rng.randrange(10**self.digits)
        return Problem(prompt=f"{a}+{b}=", answer=str(a + b))

    def verify(self, problem: Problem, completion: str) -> float:
        return exact_match(problem, completion)
