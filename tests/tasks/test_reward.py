"""Custom reward functions by import path: loading, errors naming task.reward, failures during scoring."""

from __future__ import annotations

import random
import sys
import textwrap
from pathlib import Path

import pytest

from heterorl.tasks import Problem, RewardError, Task, make_task
from heterorl.tasks.reward import load_reward_fn

from ._configs import AdditionTaskConfig, MathTaskConfig, ReversalTaskConfig

MODULE = "heterorl_test_rewards"
SOURCE = '''
import math

def length(prompt, completion, answer, **info):
    """Rewards answers of the right length, whatever their digits."""
    return float(len(completion) == len(answer))

def echo_info(prompt, completion, answer, **info):
    return float(sorted(info) == ["record", "source"] and info["record"]["answer"] == answer)

def boom(prompt, completion, answer, **info):
    raise KeyError("no such thing")

def nan(prompt, completion, answer, **info):
    return math.nan

def text(prompt, completion, answer, **info):
    return "1.0"

def no_info(prompt, completion, answer):
    return 1.0

NOT_CALLABLE = 3
'''


@pytest.fixture(autouse=True)
def reward_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)


def test_a_custom_reward_replaces_the_verifier_of_a_builtin_task() -> None:
    task = make_task(AdditionTaskConfig(digits=2, reward=f"{MODULE}:length"))
    p = Problem("47+85=", "132")
    assert task.score(p, "999") == 1.0  # the custom reward
    assert task.verify(p, "999") == 0.0  # the task's own check is still there
    plain = make_task(ReversalTaskConfig())
    assert plain.custom_reward is None
    assert plain.score(Problem("ab=", "ba"), "ba") == 1.0


def test_a_custom_reward_gets_the_task_extras(math_small: Path) -> None:
    task = make_task(MathTaskConfig(path=str(math_small), reward=f"{MODULE}:echo_info"))
    assert all(task.score(p, "anything") == 1.0 for p in task.eval_set())


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "is not a reward path; expected module:function"),
        (f"{MODULE}:length:x", "expected module:function"),
        ("heterorl_no_such_module:f", "module 'heterorl_no_such_module' not found"),
        (f"{MODULE}:missing", f"module '{MODULE}' has no attribute 'missing'"),
        (f"{MODULE}:NOT_CALLABLE", "is a int, not callable"),
        (f"{MODULE}:no_info", r"must accept \(prompt, completion, answer, \*\*info\)"),
    ],
)
def test_bad_paths_fail_when_loading_and_name_the_field(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^task\.reward: .*{message}"):
        load_reward_fn(spec)


def test_the_config_checks_the_path_format_and_make_task_loads_it() -> None:
    with pytest.raises(ValueError, match="reward"):
        AdditionTaskConfig(reward="not a path")
    with pytest.raises(ValueError, match=r"task\.reward: module 'heterorl_no_such_module' not found"):
        make_task(AdditionTaskConfig(reward="heterorl_no_such_module:f"))


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (
            "boom",
            rf"reward function {MODULE}:boom raised KeyError\('no such thing'\) at .*{MODULE}\.py:12 "
            r"on prompt '47\+85='",
        ),
        ("nan", rf"reward function {MODULE}:nan returned nan on prompt '47\+85='"),
        ("text", rf"reward function {MODULE}:text returned str '1\.0', not a real number"),
    ],
)
def test_a_failing_reward_stops_scoring_with_reward_error(fn: str, message: str) -> None:
    task = make_task(AdditionTaskConfig(reward=f"{MODULE}:{fn}"))
    with pytest.raises(RewardError, match=message):
        task.score(Problem("47+85=", "132"), "132")


def test_tasks_implement_verify_not_score() -> None:
    with pytest.raises(TypeError, match="implement `verify`, not `score`"):

        class Bad(Task):  # pragma: no cover - the class statement itself fails
            def _draw(self, rng: random.Random) -> Problem:
                return Problem("", "")

            def score(self, problem: Problem, completion: str) -> float:
                return 0.0


def test_a_reward_module_in_the_working_directory_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`heterorl run` from a directory holding my_rewards.py finds it without PYTHONPATH."""
    here = tmp_path / "project"
    here.mkdir()
    (here / "cwd_rewards_for_test.py").write_text("def one(prompt, completion, answer, **info):\n    return 1.0\n")
    monkeypatch.chdir(here)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(here))])
    monkeypatch.delitem(sys.modules, "cwd_rewards_for_test", raising=False)
    task = make_task(AdditionTaskConfig(reward="cwd_rewards_for_test:one"))
    assert task.score(Problem("1+1=", "2"), "x") == 1.0
    assert sys.path[-1] == str(here)  # appended: installed modules keep precedence


def test_a_missing_module_names_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(ValueError, match=rf"not found in the working directory {tmp_path} or on sys.path"):
        load_reward_fn("heterorl_nowhere:f")
