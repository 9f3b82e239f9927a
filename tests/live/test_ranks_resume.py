"""A learner of 2 FSDP2 ranks (torchrun, gloo on loopback) serving a live sampler resumes after SIGKILL of either
rank: torchrun ends the other rank, `--resume` continues from the newest state with the very weights it had
published (same hash), and the run ends with one record per step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, tiny_config
from heterorl.config import config_to_yaml
from heterorl.durable.state import latest_state
from heterorl.eventlog import read_events
from heterorl.launch.torchrun import free_port
from heterorl.metrics import read_metrics

TOKEN = "ranks-resume-token-" + "q" * 20
STEPS = 8


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.is_file() else []


def _rank_pid(torchrun: int, rank: int) -> int | None:
    """The worker process torchrun started as `rank` (from its environment)."""
    for child in _children(torchrun):
        try:
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return child
    return None


def _wait(condition, timeout: float, what: str, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if any(p.poll() not in (None, 0) for p in procs):
            pytest.fail(f"a process died while waiting for {what}")
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def _steps(run: Path) -> int:
    path = run / "metrics.jsonl"
    return path.read_text().count('"kind": "train"') if path.is_file() else 0


@pytest.mark.distributed
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds torchrun's workers in /proc")
@pytest.mark.parametrize("killed", [0, 1])
def test_a_two_rank_learner_resumes_after_sigkill_of_any_rank(
    tmp_path: Path, tiny_model_dir: Path, killed: int
) -> None:
    cfg = tiny_config(
        tiny_model_dir,
        f"learner.steps={STEPS}",
        "learner.micro_batch_tokens=40",
        "parallel.strategy=fsdp2",
        "live.checkpoint_every=2",
        "live.fsync=false",
        "live.poll_seconds=1",
        "live.backoff_initial_s=0.05",
        "live.backoff_max_s=0.5",
        "live.linger_s=3",
    )
    config, run = tmp_path / "config.yaml", tmp_path / "run"
    config.write_text(config_to_yaml(cfg))
    env = {
        **os.environ,
        "HETERORL_TOKEN": TOKEN,
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONPATH": str(REPO / "src"),
        "TMPDIR": str(tmp_path),  # the launcher keeps the killed follower's logs there, not in /tmp
    }
    listen = f"127.0.0.1:{free_port()}"
    learner_args = ["learner", str(config), "--listen", listen, "--run-dir", str(run), "--nproc", "2", "-q"]
    logs = [tmp_path / "learner-1.log", tmp_path / "learner-2.log", tmp_path / "sampler.log"]

    def start(args: list[str], log: Path, module: str = "heterorl.cli") -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            argv = [sys.executable, "-m", module, *args]
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    first = start(learner_args, logs[0])
    sampler = start(["sampler", str(config), "--connect", f"http://{listen}", "--index", "0"], logs[2])
    procs = [first, sampler]
    try:
        _wait(lambda: latest_state(run / "live" / "state") is not None and _steps(run) >= 3, 180, "3 steps", procs)
        pid = _rank_pid(first.pid, killed)
        assert pid is not None, "torchrun's worker not found"
        os.kill(pid, signal.SIGKILL)
        assert first.wait(timeout=120) != 0  # torchrun ends the surviving rank and fails
        path = latest_state(run / "live" / "state")
        assert path is not None
        state_version = int(path.name.split("-v")[1])

        second = start([*learner_args, "--resume"], logs[1])
        procs = [second, sampler]
        assert second.wait(timeout=300) == 0, logs[1].read_text()[-4000:]
        assert sampler.wait(timeout=60) == 0, logs[2].read_text()[-3000:]
    finally:
        for p in [*procs, first]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == STEPS
    assert summary["resumes"] == 1
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"] == list(range(1, 9))
    before, after = read_events(logs[0]), read_events(logs[1])
    (resumed,) = [e for e in after if e["event"] == "resumed"]
    assert resumed["version"] == state_version >= 2
    published = {e["version"]: e["hash"] for e in before if e["event"] == "published"}
    republished = next(e for e in after if e["event"] == "published")
    assert republished["version"] == state_version
    assert republished["hash"] == published[state_version]  # the sharded weights and moments came back exactly
