"""Custom reward functions by import path: loading, errors naming task.reward, failures during scoring."""

from __future__ import annotations

import random
import sys
import textwrap
from pathlib import Path
from typing import Any

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

CALLS = []

def batched_len(prompts, completions, answer, **kwargs):
    """TRL's signature: every completion of a batch at once, the dataset's fields as keywords."""
    CALLS.append({"prompts": prompts, "completions": completions, "answer": answer, **kwargs})
    return [float(len(c)) for c in completions]

def batched_some(completions, **kwargs):
    return [1.0 if c == "132" else None for c in completions]

def batched_short(prompts, completions, **kwargs):
    return [1.0]

def batched_nan(completions, **kwargs):
    return [float("nan")] * len(completions)

def batched_numpy(completions, **kwargs):
    import numpy as np
    return np.full(len(completions), 0.5)

def batched_no_kwargs(prompts, completions):
    return [0.0] * len(completions)

def batched_needs(completions, difficulty, **kwargs):
    return [0.0] * len(completions)
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
        (f"{MODULE}:batched_no_kwargs", r"is batched \(it has `completions`\) and must accept \*\*kwargs"),
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


def test_a_batched_function_is_called_once_per_batch_with_the_records_fields(math_small: Path) -> None:
    """TRL's keyword arguments: prompts, completions, the reference answers, and each record field but the
    prompt's (for a file: its columns; `source` for the source's name)."""
    module = __import__(MODULE)
    task = make_task(MathTaskConfig(path=str(math_small), reward=f"{MODULE}:batched_len"))
    problems = task.eval_set()[:2]
    batch = [problems[0], problems[0], problems[1]]
    assert task.score_batch(batch, ["12", "1", "a b c"]) == [2.0, 1.0, 5.0]
    (call,) = module.CALLS
    assert call["prompts"] == [p.prompt for p in batch]
    assert call["completions"] == ["12", "1", "a b c"]
    assert call["answer"] == [p.answer for p in batch]
    assert call["problem"] == [p.info["record"]["problem"] for p in batch]  # the record's own column
    assert call["source"] == ["math_small"] * 3
    assert sorted(call) == ["answer", "completions", "problem", "prompts", "source"]


def test_weighted_functions_sum_and_none_adds_nothing() -> None:
    """reward = 2 * length (per completion) + 0.5 * batched_some (1 for '132', None elsewhere)."""
    task = make_task(
        AdditionTaskConfig(reward=[f"{MODULE}:length", f"{MODULE}:batched_some"], reward_weights=[2.0, 0.5])
    )
    p = Problem("47+85=", "132")
    assert task.score_batch([p, p, p], ["132", "999", "9"]) == [2.5, 2.0, 0.0]
    assert task.score(p, "132") == 2.5


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("batched_short", r"returned list of length 1 for 2 completions"),
        ("batched_nan", r"returned nan on prompt '47\+85='"),
        ("batched_needs", r"raised TypeError\(.*difficulty.*\) .*on a batch of 2 completions"),
    ],
)
def test_a_failing_batched_reward_stops_scoring(fn: str, message: str) -> None:
    task = make_task(AdditionTaskConfig(reward=f"{MODULE}:{fn}"))
    p = Problem("47+85=", "132")
    with pytest.raises(RewardError, match=message):
        task.score_batch([p, p], ["1", "2"])


def test_a_batched_reward_may_return_an_array() -> None:
    task = make_task(AdditionTaskConfig(reward=f"{MODULE}:batched_numpy"))
    p = Problem("1+1=", "2")
    assert task.score_batch([p, p], ["2", "3"]) == [0.5, 0.5]


@pytest.mark.parametrize(
    ("reward", "weights", "message"),
    [
        (["a:b", "nocolon"], None, r"'nocolon' is not module:function"),
        (["a:b", "c:d"], [1.0], r"reward_weights has 1 weights for 2 reward functions"),
        (None, [1.0], r"reward_weights has 1 weights for 0 reward functions"),
        ([], None, r"a list of 1 to 64 reward functions, got 0"),
    ],
)
def test_the_config_checks_reward_lists(reward: Any, weights: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdditionTaskConfig(reward=reward, reward_weights=weights)


def test_a_sampler_calls_a_batched_reward_once_per_generation(tiny_model_dir: Path) -> None:
    """Real generation: K prompts x G completions are scored in one call, rewards in group order."""
    from heterorl.policy import Policy, SamplingParams
    from heterorl.sampler import Sampler

    module = __import__(MODULE)
    task = make_task(AdditionTaskConfig(digits=1, reward=f"{MODULE}:batched_len"))
    policy = Policy.load(tiny_model_dir)
    sampler = Sampler.from_policy("s", policy, task, SamplingParams(), group_size=4, seed=0)
    sampler.load_weights(0, dict(policy.model.named_parameters()))
    groups = sampler.generate_groups(3)
    (call,) = module.CALLS
    assert len(call["completions"]) == 12
    assert [float(len(c)) for c in call["completions"]] == [r for g in groups for r in g.rewards_G.tolist()]
    assert call["prompts"] == [g.prompt for g in groups for _ in range(4)]
