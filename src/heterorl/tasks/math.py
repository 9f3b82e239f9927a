"""Math word problems from data files, `datasets` directories or the Hub, rewarded by math-verify equivalence.

One source (`task.path`, with `task.problem_field` / `task.answer_field` and the held-out choice on the task) or
a weighted mixture (`task.sources`, each with its own fields and held-out set); see `heterorl.tasks.sources`.
Prompts are `task.prompt_template` with `{problem}` replaced, by default asking for the final answer in \\boxed{}.
A problem's `info` holds its `record` and its `source` name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from heterorl.tasks.base import Check, Problem
from heterorl.tasks.finite import FiniteTask
from heterorl.tasks.math_grader import MathGrader
from heterorl.tasks.sources import load_source

if TYPE_CHECKING:
    from heterorl.config import MathTaskConfig


class MathTask(FiniteTask):
    """Reward 1 when the completion's final answer equals the reference (math-verify), else 0; a completion
    with no readable answer scores 0 and is counted as unparsable (`stats()`)."""

    name = "math"
    parses_answers = True

    def __init__(self, cfg: MathTaskConfig) -> None:
        configs = cfg.source_configs()
        fields = ["task"] if not cfg.sources else [f"task.sources.{i}" for i in range(len(configs))]
        sources = [
            load_source(source, cfg.prompt_template, field, i)
            for i, (source, field) in enumerate(zip(configs, fields, strict=True))
        ]
        super().__init__(cfg.eval_size, sources)
        self.grader = MathGrader(cfg.timeout_s)

    def check(self, problem: Problem, completion: str) -> Check:
        return self.grader.check(problem.answer, completion)

    def verify(self, problem: Problem, completion: str) -> float:
        return self.check(problem, completion).score
