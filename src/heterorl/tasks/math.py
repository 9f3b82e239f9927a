"""Math word problems from a data file, rewarded by math-verify equivalence with the reference answer.

Records come from JSONL or parquet (`task.path`; field names `task.problem_field` / `task.answer_field`). The
held-out set is either a share of the file chosen by prompt hash (`task.eval_fraction`) or a separate file
(`task.eval_path`, whose prompts are then removed from training). Prompts are `task.prompt_template` with
`{problem}` replaced, by default asking for the final answer in \\boxed{}.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from heterorl.tasks.base import Problem
from heterorl.tasks.finite import FiniteTask, remove_prompts, split_by_hash
from heterorl.tasks.math_grader import MathGrader
from heterorl.tasks.records import read_records, require_fields

if TYPE_CHECKING:
    from heterorl.config import MathTaskConfig


def load_problems(path: str, config_field: str, problem_field: str, answer_field: str, template: str) -> list[Problem]:
    """Distinct problems of one file; conflicting answers for one prompt are a data error."""
    records = read_records(path, config_field)
    require_fields(records, path, {"problem_field": problem_field, "answer_field": answer_field})
    problems: dict[str, Problem] = {}
    for i, record in enumerate(records):
        problem = _text(record[problem_field], path, i, problem_field)
        answer = _text(record[answer_field], path, i, answer_field)
        p = Problem(prompt=template.replace("{problem}", problem), answer=answer, info={"record": record})
        first = problems.setdefault(p.prompt, p)
        if first.answer != answer:
            raise ValueError(f"{path}: record {i} repeats a problem with answer {answer!r} != {first.answer!r}")
    return list(problems.values())


def _text(value: Any, path: str, index: int, field: str) -> str:
    """A record value as stripped text; numbers (JSON 0.5, parquet int64) become their decimal form."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{path}: record {index} field {field!r} is {type(value).__name__}, not text or a number")
    text = str(value).strip()
    if not text:
        raise ValueError(f"{path}: record {index} field {field!r} is empty")
    return text


class MathTask(FiniteTask):
    """Reward 1 when the completion's final answer equals the reference (math-verify), else 0.

    `stats` counts checked / correct / unparsable / timeouts over the task's lifetime (see `MathGrader`).
    """

    name = "math"

    def __init__(self, cfg: MathTaskConfig) -> None:
        fields = (cfg.problem_field, cfg.answer_field, cfg.prompt_template)
        problems = load_problems(cfg.path, "task.path", *fields)
        if cfg.eval_path is None:
            train, held_out = split_by_hash(problems, cfg.eval_fraction)
        else:
            held_out = load_problems(cfg.eval_path, "task.eval_path", *fields)
            train = remove_prompts(problems, held_out)
        super().__init__(cfg.eval_size, train, held_out)
        self.grader = MathGrader(cfg.timeout_s)

    @property
    def stats(self) -> dict[str, int]:
        return self.grader.stats

    def verify(self, problem: Problem, completion: str) -> float:
        return self.grader.grade(problem.answer, completion)
