"""Custom reward functions named by import path (`task.reward: "mypkg.rewards:my_reward"`).

The function replaces the task's verifier as the training reward, for any task. Its signature:

    def my_reward(prompt: str, completion: str, answer: str, **info) -> float

`prompt` is exactly what the policy saw, `completion` the text it produced (before end-of-sequence), `answer`
the task's reference answer, and `info` the task's extras for that problem (`Problem.info`: e.g. `entry=` for a
reasoning-gym task, `record=` for a math file's row; nothing for the built-in tasks). It must accept `**info`
so that tasks can add extras without breaking it.

The module is imported from `sys.path` with the current working directory added (at the end, so installed
packages win a name clash): a `my_rewards.py` beside where you run `heterorl` is found without PYTHONPATH, as
`python -m` would find it. (The `heterorl` command, unlike `python`, does not put it there itself.)

The learner recomputes the rewards samplers report (`trust.recheck_rewards`, tasks/recheck.py), calling the same
function on the same prompt, completion and answer. A function whose value cannot be recomputed that way (it
calls a remote judge, draws random numbers, reads a clock) says so with an attribute, and its groups' rewards are
then taken as sent:

    my_reward.recomputable = False

Errors are loud: a bad path fails when the task is built (`RewardPathError` naming `task.reward`); an exception
inside the function, or a return value that is not a finite real number, stops the run with `RewardError` naming
the function, where in it the exception came from, and the prompt, because a silently wrong reward corrupts
training without any other symptom.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from heterorl.errors import SetupError
from heterorl.tasks.base import Problem

RewardFn = Callable[..., float]
_SPEC = re.compile(r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*)$")
_PROMPT_CHARS = 200  # of the prompt quoted in a RewardError


class RewardError(SetupError, RuntimeError):
    """A custom reward function failed or returned something other than a finite number."""


class RewardPathError(SetupError, ValueError):
    """`task.reward` does not name an importable, callable reward function with the documented signature."""


def _with_working_directory() -> None:
    """Make modules in the current directory importable, after everything already on the path."""
    cwd = os.getcwd()
    if not any(Path(p or ".").resolve() == Path(cwd).resolve() for p in sys.path):
        sys.path.append(cwd)


def load_reward_fn(spec: str) -> RewardFn:
    """Import `module:function` (the working directory is on the path) and check it can be called as
    documented; errors name `task.reward`."""
    m = _SPEC.match(spec)
    if m is None:
        raise RewardPathError(f"task.reward: {spec!r} is not a reward path; expected module:function")
    module_name, attr = m["module"], m["attr"]
    _with_working_directory()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):  # it, or a parent, is missing
            raise RewardPathError(
                f"task.reward: module {module_name!r} not found in the working directory {os.getcwd()} "
                "or on sys.path (PYTHONPATH)"
            ) from exc
        raise RewardPathError(f"task.reward: importing {module_name!r} failed: {exc!r}") from exc
    except Exception as exc:  # the user's module raised while importing: named, and the cause kept
        raise RewardPathError(f"task.reward: importing {module_name!r} failed: {exc!r}") from exc
    if not hasattr(module, attr):
        raise RewardPathError(f"task.reward: module {module_name!r} has no attribute {attr!r}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise RewardPathError(f"task.reward: {spec} is a {type(fn).__name__}, not callable")
    _check_signature(spec, fn)
    return fn


def _check_signature(spec: str, fn: RewardFn) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no introspectable signature: checked when called
        return
    try:
        sig.bind("prompt", "completion", "answer", some_info=None)
    except TypeError as exc:
        raise RewardPathError(
            f"task.reward: {spec} must accept (prompt, completion, answer, **info); its signature is {sig} ({exc})"
        ) from exc


def _where(exc: BaseException) -> str:
    """` at my_rewards.py:12`: the innermost frame of the exception, i.e. the line of the user's code."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" at {last.filename}:{last.lineno}"


class CustomReward:
    """A loaded reward function, called with a problem's fields and checked on every call."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.fn = load_reward_fn(spec)
        self.recomputable = bool(getattr(self.fn, "recomputable", True))  # see the module docstring

    def __call__(self, problem: Problem, completion: str) -> float:
        try:
            value = self.fn(problem.prompt, completion, problem.answer, **problem.info)
        except Exception as exc:  # re-raised: a failing reward must stop the run, with the context to debug it
            raise RewardError(
                f"reward function {self.spec} raised {exc!r}{_where(exc)} on prompt {self._quote(problem)}"
            ) from exc
        if not isinstance(value, numbers.Real):  # int, float, bool, numpy scalars; not tensors or strings
            raise RewardError(
                f"reward function {self.spec} returned {type(value).__name__} {value!r}, not a real number, "
                f"on prompt {self._quote(problem)}"
            )
        reward = float(value)
        if not math.isfinite(reward):
            raise RewardError(f"reward function {self.spec} returned {reward} on prompt {self._quote(problem)}")
        return reward

    @staticmethod
    def _quote(problem: Problem) -> str:
        p = problem.prompt
        return repr(p if len(p) <= _PROMPT_CHARS else p[:_PROMPT_CHARS] + "...")

    def __repr__(self) -> str:
        return f"CustomReward({self.spec!r})"
