"""reasoning-gym datasets as tasks: procedural, offline, each with its own answer scorer.

`task.size` entries are generated once from `task.seed` (fixed data, like a file; the run seed only orders the
training stream) and split into training and held-out problems by prompt hash. The reward is the dataset's
`score_answer(answer, entry)`, which may give partial credit (e.g. 0.5 for a near miss) in [0, 1].

Answer extraction: with `task.answer_tag` unset the whole completion, stripped, is the answer (suits a policy
trained to answer directly); with `answer_tag: answer` it is the text inside the last `<answer>...</answer>`
(reasoning-gym's own convention), and a completion without one scores 0 and is counted as unparsable.
`check` reports the extracted answer as given (reasoning-gym scorers compare text, so no canonical form).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from heterorl.errors import DataError, MissingDependencyError
from heterorl.tasks.base import Check, Problem
from heterorl.tasks.finite import FiniteTask, SourceSplit, dedupe, split_by_hash

if TYPE_CHECKING:
    from heterorl.config import GymTaskConfig


def _import_reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise MissingDependencyError("the gym task needs reasoning-gym: pip install reasoning-gym") from exc
    return reasoning_gym


def create_dataset(name: str, seed: int, size: int, options: dict[str, Any]) -> Any:
    """`reasoning_gym.create_dataset` with errors that name the config field at fault."""
    rg = _import_reasoning_gym()
    if name not in rg.factory.DATASETS:
        raise DataError(f"task.dataset: unknown reasoning-gym dataset {name!r}; valid: {sorted(rg.factory.DATASETS)}")
    try:
        return rg.create_dataset(name, seed=seed, size=size, **options)
    except (TypeError, ValueError, AssertionError) as exc:  # unknown option / failed config.validate() assert
        raise DataError(f"task.dataset_options: invalid for {name!r}: {exc}") from exc


def extract_answer(completion: str, tag: str | None) -> str | None:
    """The completion stripped (tag None), or the stripped text inside its last <tag>...</tag> (None if absent)."""
    if tag is None:
        return completion.strip()
    matches = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", completion, flags=re.DOTALL)
    return matches[-1].strip() if matches else None


class GymTask(FiniteTask):
    """One reasoning-gym dataset; with `answer_tag`, a completion without the tag is unparsable (`stats()`)."""

    name = "gym"

    def __init__(self, cfg: GymTaskConfig) -> None:
        self.dataset = create_dataset(cfg.dataset, cfg.seed, cfg.size, cfg.dataset_options)
        problems = dedupe(self._problem(entry, cfg.prompt_template) for entry in self.dataset)
        train, held_out = split_by_hash(problems, cfg.eval_fraction)
        super().__init__(cfg.eval_size, [SourceSplit(cfg.dataset, train, held_out)])
        self.answer_tag = cfg.answer_tag
        self.parses_answers = cfg.answer_tag is not None

    @staticmethod
    def _problem(entry: dict[str, Any], template: str) -> Problem:
        # A few datasets accept many answers and store none; their scorer checks the completion directly.
        answer = "" if entry["answer"] is None else str(entry["answer"])
        return Problem(prompt=template.replace("{question}", entry["question"]), answer=answer, info={"entry": entry})

    def check(self, problem: Problem, completion: str) -> Check:
        answer = extract_answer(completion, self.answer_tag)
        if answer is None:
            return Check(0.0, parsed=False)
        return Check(float(self.dataset.score_answer(answer, problem.info["entry"])), answer=answer)

    def verify(self, problem: Problem, completion: str) -> float:
        return self.check(problem, completion).score
