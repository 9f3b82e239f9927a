"""The Trainer as TRL users reach for it (each form docs/api.md promises, with real training): a config as a dict
or a RunConfig object, reward functions as Python callables (one per completion, batched, or a weighted list),
an in-memory `datasets.Dataset` as the task's data, callables reaching the live clock's sampler processes by
name; and the one-line refusals of what cannot cross a process boundary."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, tiny_config
from heterorl import Trainer
from heterorl.config import ConfigError, RunConfig
from heterorl.metrics import read_metrics
from heterorl.tasks import RewardPathError

MODULE = "heterorl_trl_rewards"
SOURCE = '''
ROWS = []  # every (prompt, difficulty) a batched function was given, in this process


def quarter(prompt, completion, answer, **info):
    return 0.25


def half(prompts, completions, **kwargs):
    return [0.5] * len(completions)


def not_mine(prompts, completions, **kwargs):
    return [None] * len(completions)


def by_difficulty(prompts, completions, answer, difficulty, **kwargs):
    """1 for an easy problem, 0 for a hard one: the dataset's own column decides."""
    assert len(prompts) == len(completions) == len(answer) == len(difficulty)
    ROWS.extend(zip(prompts, difficulty))
    return [1.0 if d == "easy" else 0.0 for d in difficulty]
'''


@pytest.fixture
def rewards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The reward module, in the working directory (where sampler processes look for it too)."""
    (tmp_path / f"{MODULE}.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    return __import__(MODULE)


def tiny_dict(model_dir: Path, steps: int = 3) -> dict[str, Any]:
    """tiny_config's settings as TRL users write them: a dict of sections."""
    return {
        "model": {"path": model_dir},  # a Path object is fine
        "task": {"name": "addition", "digits": 1, "eval_size": 16},
        "sampler": {"group_size": 4, "max_new_tokens": 3},
        "learner": {"steps": steps, "groups_per_step": 4, "lr": 1e-3},
        "eval": {"every": 3},
        "weights": {"codec": "full"},
    }


def train_records(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]


def trained(run_dir: Path) -> list[tuple[float, float]]:
    """What a step computed (not when): reward and loss of every step."""
    return [(r["reward/mean"], r["obj/loss"]) for r in train_records(run_dir)]


def test_a_config_dict_trains_exactly_like_the_config_object(tmp_path: Path, tiny_model_dir: Path) -> None:
    from_dict = Trainer(tiny_dict(tiny_model_dir), run_dir=tmp_path / "dict", show_progress=False)
    from_object = Trainer(tiny_config(tiny_model_dir, "learner.steps=3"), run_dir=tmp_path / "obj", show_progress=False)
    assert from_dict.cfg == from_object.cfg
    assert from_dict.fit()["steps"] == from_object.fit()["steps"] == 3
    assert trained(tmp_path / "dict") == trained(tmp_path / "obj")
    assert (tmp_path / "dict" / "config.yaml").read_text() == (tmp_path / "obj" / "config.yaml").read_text()


def test_overrides_apply_to_a_dict_and_to_an_object(tiny_model_dir: Path) -> None:
    cfg = Trainer(tiny_dict(tiny_model_dir), overrides=["learner.steps=7"], show_progress=False).cfg
    assert cfg.learner.steps == 7
    again = Trainer(cfg, overrides=["sampler.group_size=8"], show_progress=False).cfg
    assert (again.learner.steps, again.sampler.group_size) == (7, 8)
    assert isinstance(again, RunConfig)


def test_a_mistake_in_a_config_dict_names_the_field(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"^invalid config: learner\.stepz: unknown field; did you mean 'steps'\?$"):
        Trainer({"learner": {"stepz": 3}})
    with pytest.raises(ConfigError, match="is not config data"):
        Trainer({"learner": {"steps": object()}})


def test_reward_callables_as_a_weighted_list_are_the_training_reward(
    tmp_path: Path, tiny_model_dir: Path, rewards: Any
) -> None:
    """reward = 2 * quarter (per completion) + 1 * half (batched) + 3 * not_mine (None everywhere) = 1.0."""
    trainer = Trainer(
        tiny_dict(tiny_model_dir),
        reward_funcs=[rewards.quarter, rewards.half, rewards.not_mine],
        reward_weights=[2.0, 1.0, 3.0],
        run_dir=tmp_path / "run",
        show_progress=False,
    )
    assert trainer.cfg.task.reward == [f"{MODULE}:quarter", f"{MODULE}:half", f"{MODULE}:not_mine"]
    trainer.fit()
    records = train_records(tmp_path / "run")
    assert len(records) == 3
    assert all(r["reward/mean"] == 1.0 and r["reward/std"] == 0.0 for r in records)
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert f"- {MODULE}:half" in saved
    assert "reward_weights:\n  - 2.0\n  - 1.0\n  - 3.0" in saved


def test_an_in_memory_dataset_is_the_tasks_data(tmp_path: Path, tiny_model_dir: Path, rewards: Any) -> None:
    """A datasets.Dataset with prompt/answer columns (and one more) trains through the math task; its extra
    column reaches a batched reward function as TRL passes it."""
    datasets = pytest.importorskip("datasets")
    train = [(a, b) for a in range(10) for b in range(10) if a + b < 10]
    rows = {
        "prompt": [f"{a}+{b}=" for a, b in train],
        "answer": [str(a + b) for a, b in train],
        "difficulty": ["easy"] * len(train),
    }
    held_out = {"prompt": ["9+0=", "0+9=", "4+4="], "answer": ["9", "9", "8"], "difficulty": ["hard"] * 3}
    rows = {k: [v for v, p in zip(rows[k], rows["prompt"], strict=True) if p not in held_out["prompt"]] for k in rows}
    trainer = Trainer(
        tiny_dict(tiny_model_dir, steps=2),
        train_dataset=datasets.Dataset.from_dict(rows),
        eval_dataset=datasets.Dataset.from_dict(held_out),
        reward_funcs=rewards.by_difficulty,
        run_dir=tmp_path / "run",
        show_progress=False,
    )
    task = trainer.cfg.task
    assert (task.name, task.problem_field, task.answer_field, task.prompt_template) == (
        "math",
        "prompt",
        "answer",
        "{problem}",
    )
    data = [json.loads(line) for line in Path(task.path).read_text().splitlines()]
    assert data == [dict(zip(rows, values, strict=True)) for values in zip(*rows.values(), strict=True)]
    assert Path(task.eval_path).name == "eval_dataset.jsonl"
    summary = trainer.fit()
    assert summary["steps"] == 2
    assert all(r["reward/mean"] == 1.0 for r in train_records(tmp_path / "run"))  # every trained row is easy
    given = {prompt for prompt, _ in rewards.ROWS}
    assert given <= set(rows["prompt"])  # only training prompts were scored
    assert {d for _, d in rewards.ROWS} == {"easy"}
    evals = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "eval"]
    assert all(r["eval/accuracy"] in (0.0, 1 / 3, 2 / 3, 1.0) for r in evals)  # over the 3 held-out prompts
    again = Trainer(tiny_dict(tiny_model_dir), train_dataset=datasets.Dataset.from_dict(rows), show_progress=False)
    assert again.cfg.task.path == task.path  # the same rows, the same file


def test_a_dataset_without_the_columns_is_refused_in_one_line(tiny_model_dir: Path) -> None:
    datasets = pytest.importorskip("datasets")
    with pytest.raises(ValueError, match=r"^train_dataset: no column answer; its columns are \['prompt'\]$"):
        Trainer(tiny_dict(tiny_model_dir), train_dataset=datasets.Dataset.from_dict({"prompt": ["1+1="]}))
    chat = datasets.Dataset.from_dict({"prompt": [[{"role": "user", "content": "1+1="}]], "answer": ["2"]})
    with pytest.raises(ValueError, match="row 0 has a list prompt"):
        Trainer(tiny_dict(tiny_model_dir), train_dataset=chat)


def test_reward_callables_reach_the_live_samplers_by_name(tmp_path: Path, tiny_model_dir: Path, rewards: Any) -> None:
    """Under the live clock the samplers are other processes: they import the functions by name and score with
    them (2 * quarter + half = 1.0 in every step the learner trained)."""
    trainer = Trainer(
        tiny_dict(tiny_model_dir),
        reward_funcs=[rewards.quarter, rewards.half],
        reward_weights=[2.0, 1.0],
        run_dir=tmp_path / "run",
        show_progress=False,
    )
    summary = trainer.fit(clock="live")
    assert summary["steps"] == 3
    assert [r["reward/mean"] for r in train_records(tmp_path / "run")] == [1.0, 1.0, 1.0]


def outer() -> Any:
    def nested(prompt: str, completion: str, answer: str, **info: Any) -> float:
        return 0.0

    return nested


@pytest.mark.parametrize(
    "fn",
    [
        lambda prompt, completion, answer, **info: 0.0,
        outer(),
        functools.partial(lambda prompt, completion, answer, scale, **info: scale, scale=1.0),
    ],
    ids=["lambda", "nested", "partial"],
)
def test_a_function_without_a_name_in_a_module_is_refused(fn: Any, tiny_model_dir: Path) -> None:
    with pytest.raises(RewardPathError, match=r"^reward_funcs: .* has no name at the top level of a module"):
        Trainer(tiny_dict(tiny_model_dir), reward_funcs=fn)


def script_reward(prompt: str, completion: str, answer: str, **info: Any) -> float:
    return 0.5


def test_a_function_of_the_script_trains_in_one_process_and_is_refused_live(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function defined in the script that was run (`__main__`): the simulated clock calls it in this process;
    the live clock cannot hand it to sampler processes, and says so before starting any."""
    main = sys.modules["__main__"]
    monkeypatch.setattr(script_reward, "__module__", "__main__")
    monkeypatch.setattr(main, "script_reward", script_reward, raising=False)
    trainer = Trainer(tiny_dict(tiny_model_dir, steps=1), reward_funcs=script_reward, run_dir=tmp_path / "run")
    assert trainer.cfg.task.reward == ["__main__:script_reward"]
    trainer.show_progress = False
    trainer.fit()
    assert [r["reward/mean"] for r in train_records(tmp_path / "run")] == [0.5]
    live = Trainer(tiny_dict(tiny_model_dir), reward_funcs=script_reward, run_dir=tmp_path / "live")
    with pytest.raises(RewardPathError, match=r"defined in the script you ran \(__main__\).*move it into a module"):
        live.fit(clock="live")
    assert not (tmp_path / "live").exists()


def test_a_module_only_this_process_can_import_is_refused_live(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "scripts"
    elsewhere.mkdir()
    (elsewhere / "heterorl_far_rewards.py").write_text("def r(prompt, completion, answer, **info):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(elsewhere))  # as `python scripts/train.py` puts the script's directory first
    monkeypatch.delitem(sys.modules, "heterorl_far_rewards", raising=False)
    monkeypatch.chdir(tmp_path)
    from heterorl_far_rewards import r  # type: ignore[import-not-found]

    trainer = Trainer(tiny_dict(tiny_model_dir), reward_funcs=r, run_dir=tmp_path / "run")
    with pytest.raises(RewardPathError, match=r"does not import in a new process started in .*PYTHONPATH"):
        trainer.fit(clock="live")


def test_the_trl_style_example_trains(tmp_path: Path, tiny_model_dir: Path) -> None:
    script = REPO / "examples" / "trl_style.py"
    out = subprocess.run(
        [sys.executable, str(script), "--steps", "2", "--model", str(tiny_model_dir), "--run-dir", str(tmp_path / "r")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert out.stdout.startswith("2 steps, reward ")
    saved = (tmp_path / "r" / "config.yaml").read_text()
    assert "- __main__:correct\n  - __main__:concise" in saved  # the script's own functions, in one process
