"""What the Python `Trainer` accepts besides a config file, turned into a config every process can read.

A run's config is data: it crosses to sampler processes (live clock, Ray) and stays in the run directory. So
Python objects become references before the run starts:

- a config as a dict (or a RunConfig, or a mix) -> a validated `RunConfig`;
- a reward callable -> `module:function`, the name it has at the top level of its module; a lambda, a nested
  function, a method or a `functools.partial` has no such name and is refused with one line;
- an in-memory `datasets.Dataset` with `prompt` and `answer` columns -> a JSONL file named by its content hash
  under the cache (`$HETERORL_CACHE/datasets/`), read by the math task: the same rows give the same path, so the
  resolved config.yaml names the data exactly.

Under the live clock each reward function must also be importable by a new process started where this one runs:
a function defined in the script that was run (`__main__`) or in a module found only through the script's own
directory is refused with one line saying what to do. Nothing is pickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any

from pydantic import BaseModel

from heterorl.config import ConfigError, RunConfig, apply_overrides, validate_config
from heterorl.errors import DataError
from heterorl.tasks.reward import RewardPathError, load_reward_fn

DATA_COLUMNS = ("prompt", "answer")  # TRL's prompt column, and the reference answer held-out accuracy needs
IMPORT_CHECK_TIMEOUT_S = 120.0


def _plain(value: Any) -> Any:
    """json.dumps' fallback: paths as text, config sections as their data; anything else is refused."""
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"{type(value).__name__} {value!r} is not config data (text, numbers, lists, dicts)")


def config_from(config: RunConfig | Mapping[str, Any], overrides: Sequence[str] = ()) -> RunConfig:
    """A RunConfig from an object or a dict (sections may be config objects), with `--set`-style overrides."""
    try:
        data = json.loads(json.dumps(config, default=_plain))  # an own copy, of JSON types only
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config: a mapping of sections, got {type(config).__name__}")
    return validate_config(apply_overrides(data, list(overrides)))


# --- reward functions
def describe(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def reward_reference(fn: Callable[..., Any] | str, field: str) -> str:
    """`module:name` of a reward function: the name under which its module holds exactly this object."""
    if isinstance(fn, str):
        return fn
    if not callable(fn):
        raise RewardPathError(f"{field}: {fn!r} is not callable")
    module_name = getattr(fn, "__module__", None)
    module = sys.modules.get(module_name or "")
    names = [k for k, v in vars(module).items() if v is fn] if module is not None else []
    if not names:
        raise RewardPathError(
            f"{field}: {describe(fn)} has no name at the top level of a module (a lambda, a nested function, a "
            "method or a partial): define it with `def` at the top level of a module so that every process can "
            "import it"
        )
    name = getattr(fn, "__name__", "") if getattr(fn, "__name__", "") in names else names[0]
    return f"{module_name}:{name}"


def reward_specs(funcs: Callable[..., Any] | str | Sequence[Callable[..., Any] | str]) -> list[str]:
    """`reward_funcs` (one function or path, or a list) as `module:function` paths, each checked by loading it."""
    items = [funcs] if callable(funcs) or isinstance(funcs, str) else list(funcs)
    specs = []
    for i, fn in enumerate(items):
        field = "reward_funcs" if len(items) == 1 else f"reward_funcs[{i}]"
        spec = reward_reference(fn, field)
        load_reward_fn(spec, field)  # the path leads back to a function with a documented signature
        specs.append(spec)
    return specs


def check_importable_elsewhere(specs: Sequence[str]) -> None:
    """Each `module:function` imports in a new Python process started here (as the live clock's samplers are),
    with the working directory on its path as `task.reward` resolution adds it."""
    for spec in specs:
        module, attr = spec.split(":")
        if module == "__main__":
            raise RewardPathError(
                f"reward {attr!r} is defined in the script you ran (__main__), which sampler processes cannot "
                "import: move it into a module (e.g. my_rewards.py beside the script) and import it from there"
            )
        probe = (
            "import importlib, os, sys; sys.path.append(os.getcwd()); "
            "getattr(importlib.import_module(sys.argv[1]), sys.argv[2])"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe, module, attr],
            capture_output=True,
            text=True,
            timeout=IMPORT_CHECK_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            found = getattr(sys.modules.get(module), "__file__", None)
            where = f" (this process found it at {found})" if found else ""
            raise RewardPathError(
                f"reward {spec} does not import in a new process started in {os.getcwd()}{where}: run from the "
                "directory that holds the module, or add that directory to PYTHONPATH"
            )


# --- in-memory datasets
def _rows(dataset: Any, field: str) -> list[dict[str, Any]]:
    kind = type(dataset).__name__
    if kind == "DatasetDict":
        raise DataError(f"{field}: a DatasetDict ({sorted(dataset)}): pass one split, e.g. dataset['train']")
    if kind == "IterableDataset" or not hasattr(dataset, "to_list"):
        raise DataError(
            f"{field}: a {kind}; heterorl takes a datasets.Dataset held in memory (streaming: Dataset.from_list("
            "list(ds.take(n))))"
        )
    rows = dataset.to_list()
    if not rows:
        raise DataError(f"{field}: the dataset has no rows")
    missing = [c for c in DATA_COLUMNS if c not in rows[0]]
    if missing:
        raise DataError(f"{field}: no column {' or '.join(missing)}; its columns are {sorted(rows[0])}")
    for i, row in enumerate(rows):
        if not isinstance(row["prompt"], str):
            raise DataError(
                f"{field}: row {i} has a {type(row['prompt']).__name__} prompt (conversational?); give the user's "
                "text and set task.chat_template: true to wrap it in the tokenizer's chat template"
            )
    return rows


def dataset_file(dataset: Any, root: Path, field: str) -> Path:
    """The rows of `dataset` as `<root>/datasets/<content hash>/<field>.jsonl` (written once, atomically)."""
    rows = _rows(dataset, field)
    lines = []
    for i, row in enumerate(rows):
        try:
            lines.append(json.dumps(row, sort_keys=True, ensure_ascii=False))
        except (TypeError, ValueError) as exc:
            raise DataError(f"{field}: row {i} is not JSON data ({exc})") from None
    data = ("\n".join(lines) + "\n").encode()
    path = root / "datasets" / hashlib.sha256(data).hexdigest()[:16] / f"{field}.jsonl"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


def with_datasets(cfg: RunConfig, train: Any, eval_: Any | None, root: Path) -> RunConfig:
    """`cfg` whose task reads `train` (and `eval_` as its held-out set): the math task (math-verify checks
    `answer` for held-out accuracy) with the prompt as the dataset gives it, unless the config's math task says
    how to template it. Its reward functions, chat template and eval size are kept."""
    train_path = dataset_file(train, root, "train_dataset")
    eval_path = dataset_file(eval_, root, "eval_dataset") if eval_ is not None else None
    task = cfg.task.model_dump(mode="json", exclude={"name"})
    kept = {k: task[k] for k in ("eval_size", "chat_template", "reward", "reward_weights")}
    if cfg.task.name == "math":
        kept.update(prompt_template=task["prompt_template"], timeout_s=task["timeout_s"])
    else:
        kept["prompt_template"] = "{problem}"
    source = {"path": str(train_path), "problem_field": "prompt", "answer_field": "answer"}
    if eval_path is not None:
        source["eval_path"] = str(eval_path)
    data = cfg.model_dump(mode="json")
    data["task"] = {"name": "math", **kept, **source}
    return validate_config(data)


__all__ = [
    "check_importable_elsewhere",
    "config_from",
    "dataset_file",
    "reward_reference",
    "reward_specs",
    "with_datasets",
]
