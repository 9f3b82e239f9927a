"""The command line: flags, --version, one clear line for setup mistakes (tracebacks kept for bugs), `eval`
reading the run's own config, progress without a terminal, the summary on stdout."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import heterorl.simulated.run
from conftest import tiny_config
from heterorl import __version__
from heterorl.cli import app, idle_text, weight_traffic_text
from heterorl.config import config_to_yaml
from heterorl.evaluate import greedy_accuracy
from heterorl.policy import Policy
from heterorl.tasks import make_task

COMMANDS = [[], ["run"], ["learner"], ["sampler"], ["pretrain"], ["eval"], ["sweep"], ["report"], ["sync"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "heterorl")
def test_help_shows_flags_without_a_type(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith(f"heterorl {__version__} (python ")


def tiny_overrides(model_dir: Path, *extra: str) -> list[str]:
    cfg = tiny_config(model_dir, *extra)
    return [
        f"model.path={cfg.model.path}",
        "task.name=addition",
        "task.digits=1",
        "task.eval_size=16",
        "sampler.group_size=4",
        "sampler.max_new_tokens=3",
        "learner.steps=2",
        "learner.groups_per_step=4",
        "eval.every=1",
        "weights.codec=full",
        *extra,
    ]


def invoke_run(tmp_path: Path, overrides: list[str]) -> typer.testing.Result:
    args = ["run", "--run-dir", str(tmp_path / "run")]
    for o in overrides:
        args += ["--set", o]
    return CliRunner().invoke(app, args)


def errors(result: typer.testing.Result) -> list[str]:
    """stderr without the progress lines (timestamped) a run prints before it stops."""
    return [line for line in result.stderr.splitlines() if not re.match(r"\[\d{4}-", line)]


def test_a_missing_model_is_one_line(tmp_path: Path) -> None:
    result = invoke_run(tmp_path, [f"model.path={tmp_path / 'no-such-model'}"])
    assert result.exit_code == 1
    assert errors(result) == [
        f"heterorl: error: model.path '{tmp_path / 'no-such-model'}' is not a transformers checkpoint (no config.json)"
    ]
    assert "Traceback" not in result.output


def test_a_missing_data_file_is_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    overrides = [*tiny_overrides(tiny_model_dir), "task={name: math, path: nowhere/train.jsonl}"]
    result = invoke_run(tmp_path, overrides)
    assert result.exit_code == 1
    assert errors(result) == ["heterorl: error: task.path: data file not found: nowhere/train.jsonl"]


def test_a_failing_reward_is_one_line_that_points_into_it(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cli_bad_reward.py").write_text("def f(prompt, completion, answer, **info):\n    return 1 / 0\n")
    monkeypatch.chdir(tmp_path)  # found in the working directory
    monkeypatch.setattr(sys, "path", list(sys.path))
    result = invoke_run(tmp_path, [*tiny_overrides(tiny_model_dir), "task.reward=cli_bad_reward:f"])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    (line,) = errors(result)
    assert re.fullmatch(
        r"heterorl: error: reward function cli_bad_reward:f raised ZeroDivisionError\('division by zero'\) "
        r"at .*cli_bad_reward\.py:2 on prompt '\d\+\d='",
        line,
    ), line


def test_a_bug_keeps_its_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> dict:
        raise KeyError("a bug")

    monkeypatch.setattr(heterorl.simulated.run, "execute", broken)
    result = invoke_run(tmp_path, [])
    assert isinstance(result.exception, KeyError)  # not turned into a one-line message


def test_run_prints_progress_lines_without_a_terminal_and_the_summary_on_stdout(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    result = invoke_run(tmp_path, tiny_overrides(tiny_model_dir))
    assert result.exit_code == 0, result.output
    progress = [line for line in result.stderr.splitlines() if re.match(r"\[\d{4}-\d\d-\d\d [\d:]+\] RL ", line)]
    assert progress[0].endswith("RL 0/2 (0%) elapsed 0:00:00")
    assert " RL 2/2 (100%) " in progress[-1]
    assert " done " in progress[-1]
    assert "held-out accuracy" in result.stdout
    assert "held-out accuracy" not in result.stderr
    assert "zstd-compressed full snapshots" in result.stdout  # weights.codec=full


def test_weight_traffic_is_not_compared_with_itself() -> None:
    summary = {"weight_bytes_sent": 1.0e6, "weight_bytes_full": 1.4e6}
    full = weight_traffic_text(summary, "full", "bfloat16")
    assert full == "1.00 MB sent vs 1.40 MB of raw bfloat16 weights (1.4x less: zstd-compressed full snapshots)"
    assert "less than full" not in full
    assert weight_traffic_text(summary, "pulse", "bfloat16").endswith("(1.4x less: PULSE patches)")
    plan = {"weight_bytes_sent": 2.5e12, "weight_bytes_full": 8.6e13}  # a modelled 7B model's traffic
    assert weight_traffic_text(plan, "pulse", "bfloat16").startswith("2500.00 GB sent vs 86000.00 GB of raw bfloat16")


def test_many_samplers_idle_shares_are_one_line() -> None:
    assert idle_text({"a": 0.5, "b": 0.25}) == "a 50%, b 25%"
    many = {f"s{i}": (i % 10) / 10 for i in range(200)}
    assert idle_text(many) == "200: mean 45%, least s0 0%, most s9 90%"


@pytest.fixture
def run_dir(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """A run directory as `heterorl run` leaves it: config.yaml beside checkpoint/ (here the tiny model)."""
    cfg = tiny_config(tiny_model_dir)
    path = tmp_path / "run"
    (path / "checkpoint").mkdir(parents=True)
    Policy.load(tiny_model_dir).save(path / "checkpoint")
    (path / "config.yaml").write_text(config_to_yaml(cfg))
    return path


@pytest.mark.parametrize("target", ["run", "run/checkpoint"])
def test_eval_reads_the_config_beside_the_checkpoint(run_dir: Path, target: str, tiny_model_dir: Path) -> None:
    cfg = tiny_config(tiny_model_dir)
    task = make_task(cfg.task)
    expected = greedy_accuracy(Policy.load(run_dir / "checkpoint"), task, task.eval_set(), cfg.sampler.max_new_tokens)
    result = CliRunner().invoke(app, ["eval", str(run_dir.parent / target)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"config: {run_dir / 'config.yaml'}"
    assert lines[1] == (
        f"{run_dir / 'checkpoint'}: held-out greedy accuracy {expected:.1%} on {len(task.eval_set())} addition prompts"
    )


def test_eval_reports_pass_at_k(run_dir: Path) -> None:
    result = CliRunner().invoke(app, ["eval", str(run_dir), "--set", "eval.samples=2", "--set", "eval.samples_drawn=3"])
    assert result.exit_code == 0, result.output
    assert "with eval.samples=2, eval.samples_drawn=3" in result.stdout.splitlines()[0]
    assert re.search(r"^sampled: pass@2 [\d.]+%, maj@2 [\d.]+%, pass@1 [\d.]+%$", result.stdout, re.MULTILINE)


def test_eval_without_any_config_refuses_to_guess(tmp_path: Path, tiny_model_dir: Path) -> None:
    result = CliRunner().invoke(app, ["eval", str(tiny_model_dir)])
    assert result.exit_code == 2
    assert "no --config given and no config.yaml beside" in result.output


def test_sync_inspect_prints_its_table_on_stdout(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        '{"kind": "train", "step": 1, "sync/version": 1, "sync/bytes": 100, "sync/full_bytes": 400, '
        '"sync/changed_share": 0.5}\n'
    )
    result = CliRunner().invoke(app, ["sync", "inspect", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "4.0x" in result.stdout
    assert "total 0.000 MB sent" in result.stdout
    assert result.stderr == ""
