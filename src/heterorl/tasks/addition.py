"""`a+b=` -> a+b in decimal: a procedural task with an exact verifier."""

from __future__ import annotations

import random
import re

from heterorl.config import AdditionTaskConfig
from heterorl.tasks.base import Problem, Task, exact_match


class AdditionTask(Task):
    """Operands are uniform in [0, 10**digits); the answer is the sum without leading zeros."""

    name = "addition"
    recognises_prompts = True
    _PROMPT = re.compile(r"(0|[1-9][0-9]*)\+(0|[1-9][0-9]*)=")

    def __init__(self, cfg: AdditionTaskConfig) -> None:
        super().__init__(cfg.eval_size)
        self.digits = cfg.digits

    @property
    def max_problems(self) -> int:
        return 10 ** (2 * self.digits)

    def _draw(self, rng: random.Random) -> Problem:
        a, b = rng.randrange(10**self.digits), rng.randrange(10**self.digits)
        return Problem(prompt=f"{a}+{b}=", answer=str(a + b))

    def problem_for(self, prompt: str) -> Problem | None:
        m = self._PROMPT.fullmatch(prompt)
        if m is None or max(len(m[1]), len(m[2])) > self.digits or prompt in self._held_out_prompts():
            return None
        return Problem(prompt=prompt, answer=str(int(m[1]) + int(m[2])))

    def verify(self, problem: Problem, completion: str) -> float:
        return exact_match(problem, completion)
