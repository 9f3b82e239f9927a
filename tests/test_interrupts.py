"""Ctrl-C (SIGINT to the process group, as a terminal sends it) and SIGTERM (to the command alone, as a scheduler
sends it) end a simulated `heterorl run`, a parallel `heterorl sweep`, a standalone `heterorl learner` and
`heterorl sampler` with one line that says what was kept and how to continue, exit 130, and leave no process
behind; a simulated run's first signal lets it finish the step it is on (evaluated and saved), a second stops it at
once. Real processes and signals (`run --live`: tests/live/test_interrupt.py)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from heterorl.cli_errors import INTERRUPTED_PREFIX, SOFT_STOP_LINE

pytestmark = [
    pytest.mark.processes,  # `make test-processes`
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for child processes"),
]


def start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "heterorl.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: SIGINT to the group is a terminal's Ctrl-C
    )


def children(pid: int) -> list[int]:
    """Every descendant of `pid` now (from /proc)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
            found += kids
            todo += kids
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def train_lines(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return path.read_text().count('"kind": "train"') if path.is_file() else 0


def tiny(model_dir: Path) -> str:
    """A config on the tiny checkpoint (no warm start to build) that would train for a long time."""
    return (
        f"model: {{path: {model_dir}}}\ntask: {{name: addition, digits: 1, eval_size: 16}}\n"
        "sampler: {group_size: 4, max_new_tokens: 3}\nlearner: {steps: 100000, groups_per_step: 4}\n"
        "eval: {every: 1000}\nweights: {codec: full}\n"
    )


def interrupt(proc: subprocess.Popen[str], how: str) -> None:
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupted_run_finishes_its_step_and_says_how_to_run_it_again(
    how: str, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The first signal: the run finishes the step it is on, evaluated, with its checkpoint and summary."""
    run_dir = tmp_path / "run"
    config = tmp_path / "tiny.yaml"
    config.write_text(tiny(tiny_model_dir))
    proc = start(["run", str(config), "--run-dir", str(run_dir), "--set", "learner.steps=5000", "-q"], tmp_path)
    try:
        wait_for(lambda: train_lines(run_dir) >= 2 or proc.poll() is not None, 300, "two learner steps")
        interrupt(proc, how)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert lines[0] == SOFT_STOP_LINE, err
    assert len(lines) == 2, err
    steps = train_lines(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps < 5000
    assert (run_dir / "checkpoint" / "config.json").is_file()
    assert "held-out accuracy" in out  # the summary table, as a finished run prints it
    line = lines[1]
    assert line.startswith(f"{INTERRUPTED_PREFIX}{run_dir} holds the run stopped after step {steps} of 5000"), err
    again = shlex.split(line.split("run all 5000 steps with ", 1)[1])
    assert again == [
        *("heterorl", "run", str(config), "--run-dir", str(run_dir), "--overwrite"),
        *("--set", "learner.steps=5000"),
    ]


def test_a_second_ctrl_c_stops_a_run_at_once(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The second Ctrl-C is sent once the first was answered (two signals sent together may arrive as one), while
    the run still finishes its step and evaluates 512 held-out prompts."""
    run_dir = tmp_path / "run"
    config = tmp_path / "tiny.yaml"
    config.write_text(tiny(tiny_model_dir).replace("digits: 1, eval_size: 16", "digits: 2, eval_size: 512"))
    proc = start(["run", str(config), "--run-dir", str(run_dir), "-q"], tmp_path)
    try:
        wait_for(lambda: train_lines(run_dir) >= 2 or proc.poll() is not None, 300, "two learner steps")
        interrupt(proc, "ctrl-c")
        assert proc.stderr is not None
        first = proc.stderr.readline().strip()
        interrupt(proc, "ctrl-c")
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert first == SOFT_STOP_LINE, first + err
    lines = [first, *err.strip().splitlines()]
    assert len(lines) == 2, err
    steps = train_lines(run_dir)
    assert lines[1].startswith(
        f"{INTERRUPTED_PREFIX}{run_dir} keeps the resolved config and {steps} learner steps in metrics.jsonl"
    ), err
    assert not (run_dir / "summary.json").exists()
    assert shlex.split(lines[1].split("run it again with ", 1)[1]) == [
        "heterorl", "run", str(config), "--run-dir", str(run_dir), "--overwrite"
    ]  # fmt: skip


def test_a_terminated_sweep_ends_its_runs_too(tmp_path: Path, tiny_model_dir: Path) -> None:
    """SIGTERM to the sweep alone: its worker processes (each training a run) end with it, not minutes later."""
    (tmp_path / "tiny.yaml").write_text(tiny(tiny_model_dir))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        f"base: tiny.yaml\nname: t\nout: {tmp_path / 'out'}\ngrid:\n  learner.lr: [0.0003, 0.0001]\nworkers: 2\n"
    )
    proc = start(["sweep", str(sweep), "-q"], tmp_path)
    try:
        wait_for(
            lambda: (
                sum(train_lines(d) > 0 for d in (tmp_path / "out").glob("*") if d.is_dir()) == 2
                or proc.poll() is not None
            ),
            300,
            "both runs to train",
        )
        workers = children(proc.pid)
        assert workers, "the sweep runs its points in worker processes"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith(INTERRUPTED_PREFIX + "finished runs keep their directories")
    wait_for(lambda: not any(alive(pid) for pid in workers), 30, "the workers to end")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_standalone_sampler_and_learner_end_with_how_to_continue(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`heterorl learner` and `heterorl sampler` on two terminals: SIGTERM to the sampler mid-run ends it with one
    line (start it again); SIGTERM to the learner ends it with its state saved and the command that resumes it.
    Real processes over loopback HTTP."""
    config = tmp_path / "tiny.yaml"
    config.write_text(tiny(tiny_model_dir) + "live: {checkpoint_every: 2, poll_seconds: 0.5}\n")
    run_dir, listen = tmp_path / "run", f"127.0.0.1:{free_port()}"
    env = {**os.environ, "HETERORL_TOKEN": "t" * 24, "OMP_NUM_THREADS": "1"}

    def launch(args: list[str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "heterorl.cli", *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    learner = launch(["learner", str(config), "--listen", listen, "--run-dir", str(run_dir), "-q"])
    sampler = launch(["sampler", str(config), "--connect", f"http://{listen}"])
    try:
        wait_for(lambda: train_lines(run_dir) >= 2 or learner.poll() is not None, 300, "two learner steps")
        sampler.send_signal(signal.SIGTERM)
        _, sampler_err = sampler.communicate(timeout=60)
        learner.send_signal(signal.SIGTERM)
        _, learner_err = learner.communicate(timeout=120)
    finally:
        for proc in (sampler, learner):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert sampler.returncode == 130, sampler_err
    words = [line for line in sampler_err.splitlines() if line.strip() and not line.startswith("heterorl: no answer")]
    assert len(words) == 1, sampler_err
    assert words[0].startswith(INTERRUPTED_PREFIX + "the sampler stopped"), sampler_err
    assert shlex.split(words[0].split("start it again with ", 1)[1]) == [
        "heterorl", "sampler", str(config), "--connect", f"http://{listen}", "--index", "0"
    ]  # fmt: skip
    assert learner.returncode == 130, learner_err
    lines = learner_err.strip().splitlines()
    assert len(lines) == 1, learner_err
    kept, again = lines[0].split("; continue with ")
    assert kept.startswith(f"{INTERRUPTED_PREFIX}{run_dir} keeps the learner's state saved at version "), learner_err
    assert shlex.split(again) == [
        "heterorl", "learner", str(config), "--listen", listen, "--run-dir", str(run_dir), "--resume"
    ]  # fmt: skip
