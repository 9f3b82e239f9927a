"""Custom reward functions named by import path (`task.reward: "mypkg.rewards:my_reward"`).

The function replaces the task's verifier as the training reward, for any task. Its signature:

    def my_reward(prompt: str, completion: str, answer: str, **info) -> float

`prompt` is exactly what the policy saw, `completion` the text it produced (before end-of-sequence), `answer`
the task's reference answer, and `info` the task's extras for that problem (`Problem.info`: e.g. `entry=` for a
reasoning-gym task, `record=` for a math file's row; nothing for the built-in tasks). It must accept `**info`
so that tasks can add extras without breaking it.

Errors are loud: a bad path fails when the task is built (ValueError naming `task.reward`); an exception inside
the function, or a return value that is not a finite real number, stops the run with `RewardError` naming the
function and the prompt, because a silently wrong reward corrupts training without any other symptom.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
import re
from collections.abc import Callable

from heterorl.tasks.base import Problem

RewardFn = Callable[..., float]
_SPEC = re.compile(r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*)$")
_PROMPT_CHARS = 200  # of the prompt quoted in a RewardError


class RewardError(RuntimeError):
    """A custom reward function failed or returned something other than a finite number."""


def load_reward_fn(spec: str) -> RewardFn:
    """Import `module:function` and check it can be called as documented; errors name `task.reward`."""
    m = _SPEC.match(spec)
    if m is None:
        raise ValueError(f"task.reward: {spec!r} is not a reward path; expected module:function")
    module_name, attr = m["module"], m["attr"]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):  # it, or a parent, is missing
            raise ValueError(f"task.reward: module {module_name!r} not found (is it on sys.path?)") from exc
        raise ValueError(f"task.reward: importing {module_name!r} failed: {exc}") from exc
    if not hasattr(module, attr):
        raise ValueError(f"task.reward: module {module_name!r} has no attribute {attr!r}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise ValueError(f"task.reward: {spec} is a {type(fn).__name__}, not callable")
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
        raise ValueError(
            f"task.reward: {spec} must accept (prompt, completion, answer, **info); its signature is {sig} ({exc})"
        ) from exc


class CustomReward:
    """A loaded reward function, called with a problem's fields and checked on every call."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.fn = load_reward_fn(spec)

    def __call__(self, problem: Problem, completion: str) -> float:
        try:
            value = self.fn(problem.prompt, completion, problem.answer, **problem.info)
        except Exception as exc:  # re-raised: a failing reward must stop the run, with the context to debug it
            raise RewardError(f"reward function {self.spec} raised {exc!r} on prompt {self._quote(problem)}") from exc
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
