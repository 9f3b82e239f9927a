"""Custom reward functions named by import path (`task.reward: "mypkg.rewards:my_reward"`, or a list of them with
`task.reward_weights`).

They replace the task's verifier as the training reward, for any task; held-out evaluation keeps the verifier.
Two signatures, told apart by the name of a parameter:

    def my_reward(prompt: str, completion: str, answer: str, **info) -> float              # one completion
    def my_reward(prompts: list[str], completions: list[str], **kwargs) -> list[float]      # batched (TRL's)

A function with a parameter named `completions` is batched: it is called once per generation batch (every
completion of the sampler's groups), with keyword arguments as TRL's GRPOTrainer passes them: `prompts`,
`completions`, `answer` (the reference answers) and one list per extra field of the problems (for a data file or
an in-memory dataset: each column of its records but the prompt; `source=` for a mixture; `entry=` for a
reasoning-gym task). It returns one float per completion, or None where it does not apply. Any other function
is called once per completion: `prompt` is exactly what the policy saw, `completion` the text it produced (before
end-of-sequence), `answer` the reference answer and `info` the task's extras (`Problem.info`); it must accept
`**info` so that tasks can add extras without breaking it.

With several functions the training reward is sum_i w_i r_i (`task.reward_weights`, default 1 each); a batched
function's None contributes nothing, as in TRL.

The module is imported from `sys.path` with the current working directory added (at the end, so installed
packages win a name clash): a `my_rewards.py` beside where you run `heterorl` is found without PYTHONPATH, as
`python -m` would find it. (The `heterorl` command, unlike `python`, does not put it there itself.)

The learner recomputes the rewards samplers report (`trust.recheck_rewards`, tasks/recheck.py), calling the same
function on the same prompt, completion and answer. A function whose value cannot be recomputed that way (it
calls a remote judge, draws random numbers, reads a clock) says so with an attribute, and its groups' rewards are
then taken as sent:

    my_reward.recomputable = False

Errors are loud: a bad path fails when the task is built (`RewardPathError` naming `task.reward`); an exception
inside a function, or a value that is not a finite real number, stops the run with `RewardError` naming the
function, where in it the exception came from, and the prompt, because a silently wrong reward corrupts training
without any other symptom.
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from heterorl.errors import SetupError
from heterorl.tasks.base import Problem

RewardFn = Callable[..., Any]
_SPEC = re.compile(r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*)$")
_PROMPT_CHARS = 200  # of the prompt quoted in a RewardError
BATCH_PARAMETER = "completions"  # a function with a parameter of this name is batched (TRL's signature)
RESERVED = ("prompts", "completions", "answer")  # batched keyword arguments no problem field may replace


class RewardError(SetupError, RuntimeError):
    """A custom reward function failed or returned something other than a finite number."""


class RewardPathError(SetupError, ValueError):
    """`task.reward` does not name an importable, callable reward function with a documented signature."""


def _with_working_directory() -> None:
    """Make modules in the current directory importable, after everything already on the path."""
    cwd = os.getcwd()
    if not any(Path(p or ".").resolve() == Path(cwd).resolve() for p in sys.path):
        sys.path.append(cwd)


def load_reward_fn(spec: str, field: str = "task.reward") -> RewardFn:
    """Import `module:function` (the working directory is on the path) and check it can be called as
    documented; errors name `field`."""
    m = _SPEC.match(spec)
    if m is None:
        raise RewardPathError(f"{field}: {spec!r} is not a reward path; expected module:function")
    module_name, attr = m["module"], m["attr"]
    _with_working_directory()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):  # it, or a parent, is missing
            raise RewardPathError(
                f"{field}: module {module_name!r} not found in the working directory {os.getcwd()} "
                "or on sys.path (PYTHONPATH)"
            ) from exc
        raise RewardPathError(f"{field}: importing {module_name!r} failed: {exc!r}") from exc
    except Exception as exc:  # the user's module raised while importing: named, and the cause kept
        raise RewardPathError(f"{field}: importing {module_name!r} failed: {exc!r}") from exc
    if not hasattr(module, attr):
        where = " (a function of the script that started this run is not importable in this process)"
        raise RewardPathError(
            f"{field}: module {module_name!r} has no attribute {attr!r}" + (where if module_name == "__main__" else "")
        )
    fn = getattr(module, attr)
    if not callable(fn):
        raise RewardPathError(f"{field}: {spec} is a {type(fn).__name__}, not callable")
    _check_signature(spec, fn, field)
    return fn


def _parameters(fn: RewardFn) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no introspectable signature: checked when called
        return None


def is_batched(fn: RewardFn) -> bool:
    """TRL's batched signature: the function has a parameter named `completions`."""
    sig = _parameters(fn)
    return sig is not None and BATCH_PARAMETER in sig.parameters


def _check_signature(spec: str, fn: RewardFn, field: str) -> None:
    sig = _parameters(fn)
    if sig is None:
        return
    if is_batched(fn):  # named columns (`answer`, `difficulty`) are checked when called: the data decides them
        if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            raise RewardPathError(
                f"{field}: {spec} is batched (it has `completions`) and must accept **kwargs, as TRL's reward "
                f"functions do (every extra field arrives as a keyword); its signature is {sig}"
            )
        return
    try:
        sig.bind("prompt", "completion", "answer", some_info=None)
    except TypeError as exc:
        raise RewardPathError(
            f"{field}: {spec} must accept (prompt, completion, answer, **info), or be batched as "
            f"(prompts, completions, **kwargs); its signature is {sig} ({exc})"
        ) from exc


def _where(exc: BaseException) -> str:
    """` at my_rewards.py:12`: the innermost frame of the exception, i.e. the line of the user's code."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" at {last.filename}:{last.lineno}"


def _quote(problem: Problem) -> str:
    p = problem.prompt
    return repr(p if len(p) <= _PROMPT_CHARS else p[:_PROMPT_CHARS] + "...")


def batch_kwargs(problems: Sequence[Problem]) -> dict[str, list[Any]]:
    """A batched function's keyword arguments besides `prompts` and `completions`: `answer`, then one list per
    field of the problems' records (a data file's columns, the prompt's own excepted) and per other extra."""
    columns: dict[str, list[Any]] = {"answer": [p.answer for p in problems]}
    names: dict[str, None] = {}
    for p in problems:
        record = p.info.get("record")
        names.update(dict.fromkeys(k for k in (record if isinstance(record, dict) else {}) if k != "prompt"))
        names.update(dict.fromkeys(k for k in p.info if k != "record"))
    for name in names:
        if name in RESERVED:
            continue
        columns[name] = [_extra(p, name) for p in problems]
    return columns


def _extra(problem: Problem, name: str) -> Any:
    record = problem.info.get("record")
    if isinstance(record, dict) and name in record:
        return record[name]
    return problem.info.get(name)


class RewardFunction:
    """One loaded reward function, called per completion or per batch, its values checked on every call."""

    def __init__(self, spec: str, field: str = "task.reward") -> None:
        self.spec = spec
        self.fn = load_reward_fn(spec, field)
        self.batched = is_batched(self.fn)
        self.recomputable = bool(getattr(self.fn, "recomputable", True))  # see the module docstring

    def __call__(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[float | None]:
        """One value per completion (`problems[i]` is the problem of `completions[i]`); None: does not apply."""
        if not self.batched:
            return [self._one(problem, text) for problem, text in zip(problems, completions, strict=True)]
        kwargs = batch_kwargs(problems)
        try:
            values = self.fn(prompts=[p.prompt for p in problems], completions=list(completions), **kwargs)
        except Exception as exc:  # re-raised: a failing reward must stop the run, with the context to debug it
            raise RewardError(
                f"reward function {self.spec} raised {exc!r}{_where(exc)} on a batch of {len(problems)} "
                f"completions (first prompt {_quote(problems[0])})"
            ) from exc
        if hasattr(values, "tolist"):  # a numpy array or a tensor
            values = values.tolist()
        if not isinstance(values, list | tuple) or len(values) != len(problems):
            got = f"{type(values).__name__} of length {len(values)}" if hasattr(values, "__len__") else repr(values)
            raise RewardError(f"reward function {self.spec} returned {got} for {len(problems)} completions")
        return [None if v is None else self._check(v, problems[i]) for i, v in enumerate(values)]

    def _one(self, problem: Problem, completion: str) -> float:
        try:
            value = self.fn(problem.prompt, completion, problem.answer, **problem.info)
        except Exception as exc:  # re-raised: a failing reward must stop the run, with the context to debug it
            raise RewardError(
                f"reward function {self.spec} raised {exc!r}{_where(exc)} on prompt {_quote(problem)}"
            ) from exc
        return self._check(value, problem)

    def _check(self, value: Any, problem: Problem) -> float:
        if not isinstance(value, numbers.Real):  # int, float, bool, numpy scalars; not tensors or strings
            raise RewardError(
                f"reward function {self.spec} returned {type(value).__name__} {value!r}, not a real number, "
                f"on prompt {_quote(problem)}"
            )
        reward = float(value)
        if not math.isfinite(reward):
            raise RewardError(f"reward function {self.spec} returned {reward} on prompt {_quote(problem)}")
        return reward

    def __repr__(self) -> str:
        return f"RewardFunction({self.spec!r}{', batched' if self.batched else ''})"


class CustomReward:
    """The configured reward functions and their weights: reward = sum_i w_i r_i (a None adds nothing)."""

    def __init__(self, specs: str | Sequence[str], weights: Sequence[float] | None = None) -> None:
        specs = [specs] if isinstance(specs, str) else list(specs)
        fields = ["task.reward"] if len(specs) == 1 else [f"task.reward.{i}" for i in range(len(specs))]
        self.functions = [RewardFunction(s, f) for s, f in zip(specs, fields, strict=True)]
        self.weights = list(weights) if weights is not None else [1.0] * len(specs)
        if len(self.weights) != len(self.functions):
            raise RewardPathError(f"task.reward_weights: {len(self.weights)} weights for {len(specs)} functions")

    @property
    def spec(self) -> str:
        return ", ".join(f.spec for f in self.functions)

    @property
    def recomputable(self) -> bool:
        """Whether the learner can recompute these rewards (every function is; see the module docstring)."""
        return all(f.recomputable for f in self.functions)

    def score_batch(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[float]:
        total = [0.0] * len(problems)
        for function, weight in zip(self.functions, self.weights, strict=True):
            for i, value in enumerate(function(problems, completions)):
                if value is not None:
                    total[i] += weight * value
        return total

    def __call__(self, problem: Problem, completion: str) -> float:
        return self.score_batch([problem], [completion])[0]

    def __repr__(self) -> str:
        return f"CustomReward({self.spec!r})"
