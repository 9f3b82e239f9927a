"""Evaluation: greedy accuracy, the unbiased pass@k, maj@k by the task's canonical answers, per-source accuracy."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

import heterorl.evaluate as ev
from heterorl.config import EvalConfig
from heterorl.evaluate import evaluate, majority_score, pass_at_k
from heterorl.policy import Policy, SamplingParams
from heterorl.tasks import Check, Problem, Task


@pytest.mark.parametrize(("n", "c", "k"), [(5, 2, 2), (10, 3, 1), (10, 3, 4), (20, 1, 7), (8, 8, 3), (8, 0, 8)])
def test_pass_at_k_is_the_combinatorial_estimator(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_by_hand() -> None:
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(4, 1, 4) == 1.0  # n = k: any correct sample
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the share correct
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)


def test_majority_vote_uses_the_canonical_answer_and_first_given_on_ties() -> None:
    votes = [Check(0.0, answer="3"), Check(1.0, answer="1/2"), Check(1.0, answer="1/2"), Check(0.0, answer="3")]
    assert majority_score(votes) == 0.0  # 2 : 2, "3" was given first
    votes.append(Check(1.0, answer="1/2"))
    assert majority_score(votes) == 1.0
    unreadable = [Check(0.0, parsed=False)] * 3
    assert majority_score([*unreadable, Check(1.0, answer="7")]) == 1.0  # no answer, no vote
    assert majority_score(unreadable) == 0.0


class FirstChar(Task):
    """A completion is correct when its first character is the problem's answer (`=` for even a, `+` for odd:
    the untrained tiny model always starts with `=`, so it is right on about half); that character is the
    answer majority votes count."""

    name = "first-char"

    def __init__(self) -> None:
        super().__init__(eval_size=8)

    def _draw(self, rng: random.Random) -> Problem:
        a, b = rng.randrange(10), rng.randrange(10)
        return Problem(f"{a}+{b}=", "=" if a % 2 == 0 else "+")

    def verify(self, problem: Problem, completion: str) -> float:
        return self.check(problem, completion).score

    def check(self, problem: Problem, completion: str) -> Check:
        if not completion:
            return Check(0.0, parsed=False)
        return Check(float(completion[0] == problem.answer), answer=completion[0])


def test_metrics_from_scripted_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    """3 prompts, n = 4 samples, k = 2: every number below is computed by hand."""
    problems = [Problem("a", "1"), Problem("b", "1"), Problem("c", "5")]
    samples = {"a": ["1x", "y", "1z", "w"], "b": ["q", "r", "s", "t"], "c": ["5", "5", "", "5"]}

    class Scripted:
        device = "cpu"

        def greedy_completions(self, prompts: list[str], max_new_tokens: int) -> list[str]:
            return ["1", "", "x"]

    monkeypatch.setattr(
        ev, "sampled_completions", lambda policy, prompts, n, params, gen: [samples[p] for p in prompts]
    )
    task = FirstChar()
    task.parses_answers = True
    metrics = evaluate(Scripted(), task, problems, EvalConfig(samples=2, samples_drawn=4), max_new_tokens=4)
    assert metrics["eval/accuracy"] == pytest.approx(1 / 3)  # "1" correct, "" unreadable, "x" wrong
    assert metrics["eval/unparsable"] == pytest.approx(1 / 3)
    # pass@2 per prompt: a: c=2 -> 1 - C(2,2)/C(4,2) = 5/6; b: c=0 -> 0; c: c=3 -> 1
    assert metrics["eval/pass@2"] == pytest.approx((5 / 6 + 0 + 1) / 3)
    # maj@2 over the first 2 samples: a: "1" vs "y" tie, "1" first -> 1; b: "q" first -> 0; c: "5" -> 1
    assert metrics["eval/maj@2"] == pytest.approx(2 / 3)
    assert metrics["eval/pass@1"] == pytest.approx((2 / 4 + 0 + 3 / 4) / 3)


def test_per_source_accuracy(monkeypatch: pytest.MonkeyPatch) -> None:
    problems = [
        Problem("a", "1", info={"source": "gsm"}),
        Problem("b", "1", info={"source": "gsm"}),
        Problem("c", "2", info={"source": "math"}),
    ]

    class Scripted:
        device = "cpu"

        def greedy_completions(self, prompts: list[str], max_new_tokens: int) -> list[str]:
            return ["1", "x", "2"]

    metrics = evaluate(Scripted(), FirstChar(), problems, EvalConfig(), max_new_tokens=4)
    assert metrics == {"eval/accuracy": pytest.approx(2 / 3), "eval/gsm/accuracy": 0.5, "eval/math/accuracy": 1.0}


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> Policy:
    return Policy.load(tiny_model_dir)


def test_near_greedy_sampling_agrees_with_greedy(policy: Policy) -> None:
    """At a vanishing temperature every sample is the greedy completion: pass@k = maj@k = pass@1 = accuracy."""
    task = FirstChar()
    problems = task.eval_set()
    cold = SamplingParams(temperature=1e-4)
    metrics = evaluate(policy, task, problems, EvalConfig(samples=3), max_new_tokens=3, sampling=cold, seed=1)
    acc = metrics["eval/accuracy"]
    assert 0.0 < acc < 1.0  # the random tiny model ends some completions with a digit, not all
    assert metrics["eval/pass@3"] == metrics["eval/maj@3"] == metrics["eval/pass@1"] == pytest.approx(acc)


def test_sampled_metrics_are_seeded_and_ordered(policy: Policy) -> None:
    task = FirstChar()
    problems = task.eval_set()
    cfg = EvalConfig(samples=2, samples_drawn=6)
    policy.model.train()  # as on the learner
    first = evaluate(policy, task, problems, cfg, max_new_tokens=3, seed=5)
    assert evaluate(policy, task, problems, cfg, max_new_tokens=3, seed=5) == first
    assert first["eval/pass@2"] >= first["eval/pass@1"]  # more tries never hurt
    assert task.stats()["checked"] == 0  # evaluation counts nothing into the training counters
    assert policy.model.training  # the model's mode is restored


def test_eval_config_bounds() -> None:
    with pytest.raises(ValueError, match="samples_drawn 2 must be >= samples 4"):
        EvalConfig(samples=4, samples_drawn=2)
    with pytest.raises(ValueError, match="samples_drawn needs samples"):
        EvalConfig(samples_drawn=2)
    assert EvalConfig(samples=4).n_drawn == 4
