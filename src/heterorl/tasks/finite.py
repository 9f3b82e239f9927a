"""Tasks over a fixed list of problems (a data file, a generated dataset) with a deterministic held-out split.

The split is by a content hash of the prompt, not by file position or the run seed: the same problems give the
same held-out set in every run, whatever their order in the file, and most problems keep their side of the split
when a dataset grows. All held-out problems are excluded from training; `eval_size` only caps how many of them an
evaluation uses, so changing it never changes the training data.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable

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
        raise ValueError(f"need at least 2 distinct problems to hold some out, got {len(problems)}")
    ranked = sorted(problems, key=lambda p: prompt_key(p.prompt))
    n_held = min(max(round(fraction * len(ranked)), 1), len(ranked) - 1)
    return ranked[n_held:], ranked[:n_held]


def remove_prompts(problems: list[Problem], held_out: list[Problem]) -> list[Problem]:
    """`problems` without any whose prompt is also held out (a separate eval file may repeat training problems)."""
    banned = {p.prompt for p in held_out}
    return [p for p in problems if p.prompt not in banned]


class FiniteTask(Task):
    """Draws training problems uniformly from a fixed list; evaluates on a disjoint fixed list.

    Subclasses build the two lists (distinct prompts, no prompt in both) and implement `verify`.
    """

    def __init__(self, eval_size: int, train: list[Problem], held_out: list[Problem]) -> None:
        super().__init__(eval_size)
        if not train:
            raise ValueError(f"{self.name}: no training problems left after holding out the evaluation set")
        if not held_out:
            raise ValueError(f"{self.name}: no held-out problems")
        overlap = {p.prompt for p in train} & {p.prompt for p in held_out}
        assert not overlap, f"{len(overlap)} prompts are both training and held-out problems"
        self.train_problems = train
        self.held_out_problems = held_out

    @property
    def max_problems(self) -> int:
        return len(self.train_problems) + len(self.held_out_problems)

    def _draw(self, rng: random.Random) -> Problem:
        return rng.choice(self.train_problems)

    def eval_set(self) -> list[Problem]:
        """The first `eval_size` held-out problems (in hash order: deterministic, independent of file order)."""
        return self.held_out_problems[: self.eval_size]
