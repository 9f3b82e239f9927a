"""reasoning-gym datasets as tasks: procedural, offline, each with its own answer scorer.

`task.size` entries are generated once from `task.seed` (fixed data, like a file; the run seed only orders the
training stream) and split into training and held-out problems by prompt hash. The reward is the dataset's
`score_answer(answer, entry)`, which may give partial credit (e.g. 0.5 for a near miss) in [0, 1].

Answer extraction: with `task.answer_tag` unset the whole completion, stripped, is the answer (suits a policy
trained to answer directly); with `answer_tag: answer` it is the text inside the last `<answer>...</answer>`
(reasoning-gym's own convention), and a completion without one scores 0 and is counted as unparsable.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any

from heterorl.tasks.base import Problem
from heterorl.tasks.finite import FiniteTask, dedupe, split_by_hash

if TYPE_CHECKING:
    from heterorl.config import GymTaskConfig


def _import_reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError("the gym task needs reasoning-gym: pip install reasoning-gym") from exc
    return reasoning_gym


def create_dataset(name: str, seed: int, size: int, options: dict[str, Any]) -> Any:
    """`reasoning_gym.create_dataset` with errors that name the config field at fault."""
    rg = _import_reasoning_gym()
    if name not in rg.factory.DATASETS:
        raise ValueError(f"task.dataset: unknown reasoning-gym dataset {name!r}; valid: {sorted(rg.factory.DATASETS)}")
    try:
        return rg.create_dataset(name, seed=seed, size=size, **options)
    except (TypeError, ValueError, AssertionError) as exc:  # unknown option / failed config.validate() assert
        raise ValueError(f"task.dataset_options: invalid for {name!r}: {exc}") from exc


def extract_answer(completion: str, tag: str | None) -> str | None:
    """The completion stripped (tag None), or the stripped text inside its last <tag>...</tag> (None if absent)."""
    if tag is None:
        return completion.strip()
    matches = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", completion, flags=re.DOTALL)
    return matches[-1].strip() if matches else None


class GymTask(FiniteTask):
    """One reasoning-gym dataset; `stats` counts checked and unparsable (no answer tag) completions."""

    name = "gym"

    def __init__(self, cfg: GymTaskConfig) -> None:
        self.dataset = create_dataset(cfg.dataset, cfg.seed, cfg.size, cfg.dataset_options)
        problems = dedupe(self._problem(entry, cfg.prompt_template) for entry in self.dataset)
        train, held_out = split_by_hash(problems, cfg.eval_fraction)
        super().__init__(cfg.eval_size, train, held_out)
        self.answer_tag = cfg.answer_tag
        self.stats: dict[str, int] = {"checked": 0, "unparsable": 0}
        self._lock = threading.Lock()

    @staticmethod
    def _problem(entry: dict[str, Any], template: str) -> Problem:
        # A few datasets accept many answers and store none; their scorer checks the completion directly.
        answer = "" if entry["answer"] is None else str(entry["answer"])
        return Problem(prompt=template.replace("{question}", entry["question"]), answer=answer, info={"entry": entry})

    def verify(self, problem: Problem, completion: str) -> float:
        answer = extract_answer(completion, self.answer_tag)
        with self._lock:
            self.stats["checked"] += 1
            self.stats["unparsable"] += answer is None
        if answer is None:
            return 0.0
        return float(self.dataset.score_answer(answer, problem.info["entry"]))
