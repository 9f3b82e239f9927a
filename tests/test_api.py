"""The Python API: a Trainer runs a config under either clock, callbacks see every record in order, `stop()` ends
a run early with its final evaluation, checkpoint and summary; the example script and the CLI use it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from conftest import REPO, tiny_config
from heterorl import Callback, Trainer
from heterorl.cli import app
from heterorl.metrics import read_metrics
from heterorl.run.run_dir import RunDirError


class Recorder(Callback):
    def __init__(self, stop_at: int | None = None) -> None:
        self.events: list[tuple[str, int]] = []
        self.stop_at = stop_at

    def on_start(self, trainer: Trainer) -> None:
        self.events.append(("start", 0))

    def on_step(self, trainer: Trainer, record: dict[str, Any]) -> None:
        self.events.append(("step", record["step"]))
        if record["step"] == self.stop_at:
            trainer.stop()

    def on_evaluate(self, trainer: Trainer, record: dict[str, Any]) -> None:
        self.events.append(("eval", record["step"]))

    def on_end(self, trainer: Trainer, summary: dict[str, Any]) -> None:
        self.events.append(("end", summary["steps"]))


def test_callbacks_see_every_record_and_stop_ends_the_run_cleanly(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = tiny_config(tiny_model_dir, "learner.steps=8", "eval.every=3")
    seen = Recorder(stop_at=4)
    trainer = Trainer(cfg, run_dir=tmp_path / "run", callbacks=[seen], show_progress=False)
    summary = trainer.fit()
    assert summary["steps"] == 4  # stopped after step 4 (of 8)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in records] == [
        ("eval", 0), ("train", 1), ("train", 2), ("train", 3), ("eval", 3), ("train", 4), ("eval", 4)
    ]  # fmt: skip
    steps = [("step" if r["kind"] == "train" else "eval", r["step"]) for r in records]
    assert seen.events == [steps[0], ("start", 0), *steps[1:], ("end", 4)]  # on_start after the initial evaluation
    assert summary["accuracy_final"] == records[-1]["eval/accuracy"]  # the early end was evaluated
    assert (tmp_path / "run" / "checkpoint" / "config.json").is_file()
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 4


def test_live_callbacks_follow_the_learner_and_stop_finishes_it(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Live, the callbacks run in this process as the learner writes its records; `stop()` tells the learner to
    finish (SIGUSR1) after the step it is on, with a final evaluation and summary."""
    cfg = tiny_config(tiny_model_dir, "learner.steps=300", "eval.every=3")
    seen = Recorder(stop_at=4)
    summary = Trainer(cfg, run_dir=tmp_path / "run", callbacks=[seen], show_progress=False).fit(clock="live")
    assert 4 <= summary["steps"] < 300
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    steps = [("step" if r["kind"] == "train" else "eval", r["step"]) for r in records]
    assert [e for e in seen.events if e[0] != "start"] == [*steps, ("end", summary["steps"])]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, summary["steps"] + 1))
    assert records[-1] == {**records[-1], "kind": "eval", "step": summary["steps"]}  # the early end was evaluated
    assert summary["accuracy_final"] == records[-1]["eval/accuracy"]


def test_a_run_directory_holding_a_run_is_refused_unless_overwritten(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = tiny_config(tiny_model_dir, "learner.steps=2", "eval.every=2")
    Trainer(cfg, run_dir=tmp_path / "run", show_progress=False).fit()
    with pytest.raises(RunDirError, match="already holds a run"):
        Trainer(cfg, run_dir=tmp_path / "run", show_progress=False).fit()
    Trainer(cfg, run_dir=tmp_path / "run", show_progress=False, overwrite=True).fit()
    train = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]  # replaced, not appended
    result = CliRunner().invoke(
        app, ["run", "--run-dir", str(tmp_path / "run"), "--set", f"model.path={tiny_model_dir}"]
    )
    assert result.exit_code == 2
    assert "already holds a run" in result.output
    assert "--resume" not in result.output  # `heterorl run` has none: it is not offered
    assert "Traceback" not in result.output


def test_the_example_script_trains_through_the_api(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "examples/train_from_python.py",
            "--steps",
            "6",
            "--target",
            "1.01",
            "--run-dir",
            str(tmp_path / "r"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    assert "held-out accuracy" in out.stdout
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["steps"] == 6


def test_the_cli_runs_through_the_trainer(tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch):
    fitted: list[str] = []
    original = Trainer.fit

    def spy(self: Trainer, clock: str = "simulated", ray: str | None = None, **kw: Any) -> dict[str, Any] | None:
        fitted.append(clock)
        return original(self, clock, ray, **kw)

    monkeypatch.setattr(Trainer, "fit", spy)
    args = ["run", "--run-dir", str(tmp_path / "run"), "-q", "--set", f"model.path={tiny_model_dir}"]
    args += ["--set", "learner.steps=2", "--set", "learner.groups_per_step=4", "--set", "sampler.group_size=4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert fitted == ["simulated"]
