"""What a task is: a seeded stream of training problems, a disjoint held-out set, and a verifier.

`verify` is the task's own exact check (what held-out accuracy measures); `check` is the same verdict with what
it saw: whether an answer could be read at all, and that answer (for majority votes). `score` is the training
reward: the verifier, unless a custom reward function was configured (`task.reward`, see
`heterorl.tasks.reward`), in which case that function replaces it for every task alike.

`stats()` counts the verifier's training verdicts (checked, correct, unparsable, timeouts), so that a policy
whose answers cannot be read (reward 0 for a reason no reward curve shows) is visible in the metrics.
Evaluation calls `check`, which counts nothing: the counters describe the training data alone.
"""

from __future__ import annotations

import random
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heterorl.tasks.reward import CustomReward


@dataclass(frozen=True)
class Problem:
    """One prompt, the reference answer its verifier compares against, and task-specific extras.

    `info` travels to custom reward functions as keyword arguments (e.g. the reasoning-gym entry, or the source
    record of a data file); it takes no part in equality, so two problems with the same prompt and answer are equal.
    """

    prompt: str
    answer: str
    info: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Check:
    """One verdict. `score` in [0, 1]; `parsed`: an answer could be read from the completion (False means a 0
    for want of an answer, not for a wrong one); `timed_out`: the check ran past its time limit; `answer`: the
    answer read, in a canonical text form (equal answers, equal text as far as the task can tell), or None."""

    score: float
    parsed: bool = True
    timed_out: bool = False
    answer: str | None = None


STAT_KEYS = ("checked", "correct", "unparsable", "timeouts")


def stats_delta(now: Mapping[str, int], before: Mapping[str, int]) -> dict[str, float]:
    """`task/*` metrics for the verdicts between two `Task.stats()` snapshots: the counts, and the shares
    `task/unparsable_frac` and `task/correct_frac` of the verdicts checked in between (0 when none was)."""
    delta = {k: now.get(k, 0) - before.get(k, 0) for k in STAT_KEYS}
    checked = delta["checked"]
    return {
        **{f"task/{k}": float(v) for k, v in delta.items()},
        "task/unparsable_frac": delta["unparsable"] / checked if checked else 0.0,
        "task/correct_frac": delta["correct"] / checked if checked else 0.0,
    }


class Task(ABC):
    """A verifiable task. Subclasses implement `_draw` (one random problem) and `verify`.

    The held-out evaluation set is drawn from its own fixed stream and removed from every training stream, so
    evaluation measures generalisation to unseen prompts.
    """

    name: str
    parses_answers = False  # True where a completion may hold no readable answer (math, tagged gym answers)
    recognises_prompts = False  # True where `problem_for` can tell the task's training prompts (the learner's recheck)
    _EVAL_SEED = 1_000_003

    def __init__(self, eval_size: int) -> None:
        self.eval_size = eval_size
        self._eval: list[Problem] | None = None
        self._held_out: frozenset[str] | None = None
        # Set by `make_task` from `task.reward`; None keeps the verifier as the reward.
        self.custom_reward: CustomReward | None = None
        self._stats = dict.fromkeys(STAT_KEYS, 0)
        self._stats_lock = threading.Lock()  # samplers may score from worker threads

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Overriding `score` would silently bypass a configured custom reward.
        if "score" in cls.__dict__:
            raise TypeError(f"{cls.__name__}: implement `verify`, not `score` (score dispatches to task.reward)")

    @abstractmethod
    def _draw(self, rng: random.Random) -> Problem:
        """One problem drawn uniformly from the task's distribution."""

    @abstractmethod
    def verify(self, problem: Problem, completion: str) -> float:
        """The task's own check of a completion (text before end-of-sequence) for `problem`, in [0, 1]."""

    def check(self, problem: Problem, completion: str) -> Check:
        """The verdict with what it saw; tasks that read an answer out of the completion override it. The
        default: `verify`, the whole completion stripped as the answer."""
        return Check(self.verify(problem, completion), answer=completion.strip())

    def score(self, problem: Problem, completion: str) -> float:
        """Training reward: the custom reward function when configured, else the verifier's verdict (counted)."""
        if self.custom_reward is not None:
            return self.custom_reward(problem, completion)
        verdict = self.check(problem, completion)
        with self._stats_lock:
            self._stats["checked"] += 1
            self._stats["correct"] += verdict.score >= 1.0
            self._stats["unparsable"] += not verdict.parsed
            self._stats["timeouts"] += verdict.timed_out
        return verdict.score

    def problem_for(self, prompt: str) -> Problem | None:
        """The training problem whose prompt this is, with the task's own answer; None when it is not one (a
        held-out prompt, or none the task would draw). Only meaningful where `recognises_prompts`: the learner
        uses it to recompute a sampler's rewards without believing the answer the sampler sent."""
        return None

    def score_batch(self, problems: list[Problem], completions: list[str]) -> list[float]:
        """`score` of each completion (`problems[i]` is the problem of `completions[i]`), in one call of each
        batched reward function."""
        if self.custom_reward is not None:
            return self.custom_reward.score_batch(problems, completions)
        return [self.score(p, c) for p, c in zip(problems, completions, strict=True)]

    def stats(self) -> dict[str, int]:
        """Counts of the verifier's training verdicts so far (a copy): checked, correct (full score), unparsable
        (no answer could be read), timeouts. A custom reward replaces the verifier, so it counts nothing."""
        with self._stats_lock:
            return dict(self._stats)

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

    def _held_out_prompts(self) -> frozenset[str]:
        """The held-out prompts (computed once): never training prompts."""
        if self._held_out is None:
            self._held_out = frozenset(p.prompt for p in self.eval_set())
        return self._held_out

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
