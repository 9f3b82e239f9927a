"""What a task is: a seeded stream of training problems, a disjoint held-out set, and an exact verifier."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One prompt and the reference answer its verifier compares against."""

    prompt: str
    answer: str


class Task(ABC):
    """A verifiable task. Subclasses implement `_draw` (one random problem) and `score`.

    The held-out evaluation set is drawn from its own fixed stream and removed from every training stream, so
    evaluation measures generalisation to unseen prompts.
    """

    name: str
    _EVAL_SEED = 1_000_003

    def __init__(self, eval_size: int) -> None:
        self.eval_size = eval_size
        self._eval: list[Problem] | None = None

    @abstractmethod
    def _draw(self, rng: random.Random) -> Problem:
        """One problem drawn uniformly from the task's distribution."""

    @abstractmethod
    def score(self, problem: Problem, completion: str) -> float:
        """Reward of a completion (text before end-of-sequence) for `problem`."""

    @property
    def max_problems(self) -> int | None:
        """Number of distinct problems if the space is small (None = effectively unbounded)."""
        return None

    def eval_set(self) -> list[Problem]:
        """The held-out problems (distinct prompts, deterministic, independent of the run's seed)."""
        if self._eval is None:
            rng = random.Random(self._EVAL_SEED)
            seen: dict[str, Problem] = {}
            limit = self.max_problems
            wanted = self.eval_size if limit is None else min(self.eval_size, limit // 4)
            while len(seen) < wanted:
                p = self._draw(rng)
                seen.setdefault(p.prompt, p)
            self._eval = list(seen.values())
        return self._eval

    def train_stream(self, seed: int) -> Iterator[Problem]:
        """An endless seeded stream of training problems that never yields a held-out prompt."""
        held_out = {p.prompt for p in self.eval_set()}
        rng = random.Random(seed)
        while True:
            p = self._draw(rng)
            if p.prompt not in held_out:
                yield p


def exact_match(problem: Problem, completion: str) -> float:
    """1.0 when the completion equals the reference answer exactly, else 0.0."""
    return 1.0 if completion == problem.answer else 0.0
