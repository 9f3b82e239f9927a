"""Interrupting `heterorl run --live`: SIGTERM (and Ctrl-C, the same path) ends it with one line saying what was
kept and how to continue, no child is left running, and `--resume` continues the run to its last step with
nothing acknowledged lost; SIGKILL of the launcher takes its children down with it."""

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

from conftest import tiny_config
from heterorl.cli_errors import INTERRUPTED_EXIT, INTERRUPTED_PREFIX
from heterorl.config import config_to_yaml
from heterorl.eventlog import read_events
from live.test_processes import processes, state_group_ids  # noqa: F401 (its reward module and environment)

pytestmark = pytest.mark.processes  # `make test-processes`

HETERORL = str(Path(sys.executable).parent / "heterorl")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def children_of(run: Path) -> list[int]:
    """The learner's and samplers' pids (the learner's address file, the samplers' `started` lines)."""
    pids = [json.loads((run / "live" / "learner.json").read_text())["pid"]]
    for log in sorted((run / "live").glob("sampler-*.log")):
        pids += [e["pid"] for e in read_events(log, "started") if "pid" in e]
    return pids


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def steps_done(run: Path) -> int:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return 0
    return sum('"kind": "train"' in line for line in path.read_text().splitlines())


@pytest.fixture
def config(tmp_path: Path, tiny_model_dir: Path, processes) -> tuple[Path, dict[str, str]]:  # noqa: F811
    cfg = tiny_config(
        tiny_model_dir,
        "task.reward=heterorl_live_proc_reward:length",
        "cluster.samplers=[{name: a}, {name: b}]",
        "cluster.mode=async",
        "learner.steps=12",
        "live.checkpoint_every=2",
        "live.poll_seconds=0.5",
    )
    path = tmp_path / "config.yaml"
    path.write_text(config_to_yaml(cfg))
    return path, processes.env


def test_sigterm_ends_with_one_line_leaves_no_child_and_resume_finishes_the_run(tmp_path: Path, config) -> None:
    path, env = config
    run = tmp_path / "run"
    argv = [HETERORL, "run", str(path), "--live", "--run-dir", str(run), "--quiet"]
    first = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: steps_done(run) >= 4, 240, "four steps")
    pids = children_of(run)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=120)
    assert first.returncode == INTERRUPTED_EXIT, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    kept, again = lines[0].split("; continue with ")
    assert kept.startswith(f"{INTERRUPTED_PREFIX}{run} keeps the learner's state saved at version "), err
    assert shlex.split(again) == ["heterorl", *argv[1:-1], "--resume"]  # the same command, --resume added
    wait_for(lambda: not any(alive(p) for p in pids), 30, "every child to end")

    again = subprocess.run([*argv, "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumes"] == 1
    assert steps_done(run) == 12  # the records of the steps redone after the state were cut, none twice
    logs = sorted((run / "live").glob("sampler-*.log"))
    acked = {
        e["group_id"] for log in logs for e in read_events(log, "pushed") if e["outcome"] in ("accepted", "duplicate")
    }
    consumed, queued = state_group_ids(run)
    assert acked
    assert acked <= consumed | queued  # nothing acknowledged lost across the interruption


def test_ctrl_c_ends_with_one_line_and_leaves_no_child(tmp_path: Path, config) -> None:
    """Ctrl-C as a terminal sends it: SIGINT to the launcher's process group (the children are in sessions of
    their own, so the launcher ends them: SIGTERM, the learner saving its state)."""
    path, env = config
    run = tmp_path / "run"
    argv = [HETERORL, "run", str(path), "--live", "--run-dir", str(run), "--quiet"]
    launcher = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for(lambda: steps_done(run) >= 1 and len(children_of(run)) == 3, 240, "the first step")
    pids = children_of(run)
    os.killpg(launcher.pid, signal.SIGINT)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == INTERRUPTED_EXIT, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"{INTERRUPTED_PREFIX}{run} keeps the learner's state saved at version "), err
    assert err.strip().endswith(f"--run-dir {run} --resume"), err
    wait_for(lambda: not any(alive(p) for p in pids), 30, "every child to end")


def test_resume_refuses_a_directory_with_nothing_to_resume(tmp_path: Path, config) -> None:
    path, env = config
    argv = [HETERORL, "run", str(path), "--live", "--run-dir", str(tmp_path / "typo"), "--resume", "--quiet"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"heterorl: error: --resume: {tmp_path / 'typo'} holds no live learner state to continue (nothing to resume)"
    ]
    assert not (tmp_path / "typo" / "metrics.jsonl").exists()


def test_sigkill_of_the_launcher_takes_its_children_down(tmp_path: Path, config) -> None:
    path, env = config
    run = tmp_path / "run"
    argv = [HETERORL, "run", str(path), "--live", "--run-dir", str(run), "--quiet"]
    launcher = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: steps_done(run) >= 1 and len(children_of(run)) == 3, 240, "the first step")
    pids = children_of(run)
    launcher.kill()
    launcher.wait(timeout=30)
    wait_for(lambda: not any(alive(p) for p in pids), 60, "the children to die with their parent")
