"""Tasks over fixed lists of problems (data files, a generated dataset) with a deterministic held-out split.

The split is by a content hash of the prompt, not by file position or the run seed: the same problems give the
same held-out set in every run, whatever their order in the file, and most problems keep their side of the split
when a dataset grows. All held-out problems are excluded from training; `eval_size` only caps how many of them an
evaluation uses (per source), so changing it never changes the training data.

A task may have several sources (a mixture): a training draw first picks a source with probability proportional
to its weight, then a problem of that source uniformly, both from the stream's one seeded generator.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable
from dataclasses import dataclass

from heterorl.errors import DataError
from heterorl.tasks.base import Problem, Task


def dedupe(problems: Iterable[Problem]) -> list[Problem]:
    """The first problem of each distinct prompt, in order (a repeated prompt would be sampled twice as often)."""
    seen: dict[str, Problem] = {}
    for p in problems:
        seen.setdefault(p.prompt, p)
    return list(seen.values())


def prompt_key(prompt: str) -> bytes:
    """A stable (process- and platform-independent) hash of a prompt; Python's `hash` is salted per process."""
    return hashlib.blake2b(prompt.encode("utf-8"), digest_size=16).digest()


def split_by_hash(problems: list[Problem], fraction: float) -> tuple[list[Problem], list[Problem]]:
    """(train, held_out): the round(fraction * n) problems with the smallest prompt hashes are held out.

    Both sides keep at least one problem; `problems` must have distinct prompts (see `dedupe`).
    """
    if len(problems) < 2:
        raise DataError(f"need at least 2 distinct problems to hold some out, got {len(problems)}")
    ranked = sorted(problems, key=lambda p: prompt_key(p.prompt))
    n_held = min(max(round(fraction * len(ranked)), 1), len(ranked) - 1)
    return ranked[n_held:], ranked[:n_held]


def remove_prompts(problems: list[Problem], held_out: list[Problem]) -> list[Problem]:
    """`problems` without any whose prompt is also held out (a separate eval file may repeat training problems)."""
    banned = {p.prompt for p in held_out}
    return [p for p in problems if p.prompt not in banned]


@dataclass
class SourceSplit:
    """One source's problems: `train` and `held_out` have distinct prompts; `weight` is its share of draws."""

    name: str
    train: list[Problem]
    held_out: list[Problem]
    weight: float = 1.0


class FiniteTask(Task):
    """Draws training problems from fixed lists (one per source); evaluates on disjoint fixed lists.

    Subclasses build the sources and implement `verify`.
    """

    recognises_prompts = True

    def __init__(self, eval_size: int, sources: list[SourceSplit]) -> None:
        super().__init__(eval_size)
        if not sources:
            raise ValueError(f"{self.name}: no data sources")
        banned = {p.prompt for s in sources for p in s.held_out}  # no source trains on another's held-out prompt
        self.sources = [
            SourceSplit(s.name, [p for p in s.train if p.prompt not in banned], s.held_out, s.weight) for s in sources
        ]
        for s in self.sources:
            where = f"{self.name}" + (f" source {s.name!r}" if len(sources) > 1 else "")
            if not s.train:
                raise DataError(f"{where}: no training problems left after holding out the evaluation set")
            if not s.held_out:
                raise DataError(f"{where}: no held-out problems")
        self._weights = [s.weight for s in self.sources]
        self._by_prompt: dict[str, Problem] | None = None  # training prompt -> problem (the learner's recheck)

    def problem_for(self, prompt: str) -> Problem | None:
        if self._by_prompt is None:
            self._by_prompt = {p.prompt: p for p in self.train_problems}
        return self._by_prompt.get(prompt)

    @property
    def train_problems(self) -> list[Problem]:
        return [p for s in self.sources for p in s.train]

    @property
    def held_out_problems(self) -> list[Problem]:
        return [p for s in self.sources for p in s.held_out]

    @property
    def max_problems(self) -> int:
        return len(self.train_problems) + len(self.held_out_problems)

    def _draw(self, rng: random.Random) -> Problem:
        if len(self.sources) == 1:  # one source: one draw per problem, as a plain list
            return rng.choice(self.sources[0].train)
        source = rng.choices(self.sources, weights=self._weights)[0]
        return rng.choice(source.train)

    def eval_set(self) -> list[Problem]:
        """The first `eval_size` held-out problems of each source (in hash order: deterministic, independent of
        file order), source after source."""
        return [p for s in self.sources for p in s.held_out[: self.eval_size]]
