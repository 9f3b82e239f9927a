"""Verdict counters: training scoring is counted (unparsable answers visible), evaluation checks are not."""

from __future__ import annotations

from pathlib import Path

import pytest

from heterorl.tasks import Check, Problem, make_task, stats_delta

from ._configs import AdditionTaskConfig, MathTaskConfig


def test_every_task_counts_its_training_verdicts() -> None:
    task = make_task(AdditionTaskConfig(digits=1))
    p = Problem("3+4=", "7")
    assert task.stats() == {"checked": 0, "correct": 0, "unparsable": 0, "timeouts": 0}
    task.score(p, "7")
    task.score(p, "8")
    assert task.stats() == {"checked": 2, "correct": 1, "unparsable": 0, "timeouts": 0}
    assert task.check(p, " 7 ") == Check(0.0, answer="7")  # exact match: the stripped completion is the answer
    assert task.stats()["checked"] == 2  # checking (evaluation) counts nothing


def test_math_reports_unparsable_answers_and_a_canonical_answer(math_small: Path) -> None:
    task = make_task(MathTaskConfig(path=str(math_small)))
    p = Problem("p", "1/2")
    assert task.check(p, "so \\boxed{0.5}") == Check(1.0, answer="1/2")
    assert task.check(p, "\\boxed{2/4}").answer == task.check(p, "\\frac{1}{2}").answer == "1/2"
    assert task.check(p, "no idea") == Check(0.0, parsed=False)
    assert task.parses_answers
    before = task.stats()
    for completion in ("no idea", "I refuse", "\\boxed{1/2}", "\\boxed{3}"):
        task.score(p, completion)
    metrics = stats_delta(task.stats(), before)
    assert metrics["task/checked"] == 4.0
    assert metrics["task/unparsable"] == 2.0
    assert metrics["task/unparsable_frac"] == pytest.approx(0.5)
    assert metrics["task/correct_frac"] == pytest.approx(0.25)


def test_a_custom_reward_bypasses_the_counters(math_small: Path, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "stats_reward_mod.py").write_text("def one(prompt, completion, answer, **info):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    task = make_task(MathTaskConfig(path=str(math_small), reward="stats_reward_mod:one"))
    task.score(Problem("p", "1"), "no idea")
    assert task.stats()["checked"] == 0


def test_stats_delta_of_nothing_checked_is_zero() -> None:
    same = {"checked": 5, "correct": 2, "unparsable": 1, "timeouts": 0}
    assert stats_delta(same, same) == {
        "task/checked": 0.0,
        "task/correct": 0.0,
        "task/unparsable": 0.0,
        "task/timeouts": 0.0,
        "task/unparsable_frac": 0.0,
        "task/correct_frac": 0.0,
    }
