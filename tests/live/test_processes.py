"""The live cluster as real processes on loopback: a learner and two samplers train; a sampler killed with
SIGKILL rejoins; the learner killed with SIGKILL resumes at its checkpointed version without losing a group it
acknowledged; every weight hash a sampler held is one the learner published; run_live cleans up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import tiny_config
from heterorl.config import config_to_yaml
from heterorl.durable.state import latest_state, read_records
from heterorl.eventlog import read_events
from heterorl.metrics import read_metrics
from heterorl.rollout_codec import GroupLimits, decode_group

pytestmark = pytest.mark.processes  # `make test-processes`

TOKEN = "process-test-token-" + "z" * 20
REWARD_SOURCE = "def length(prompt, completion, answer, **info):\n    return float(len(completion))\n"


class Processes:
    """Node processes of one test, each logging to its own file; all killed at the end."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        logs.mkdir()

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("wb") as log:
            argv = [sys.executable, "-m", "heterorl.live.node", *args]
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        return self.procs[name]

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() not in (None, 0, -9):
                pytest.fail(f"{name} exited with {p.returncode}:\n{self.log(name).read_text()[-3000:]}")

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "heterorl_live_proc_reward.py").write_text(REWARD_SOURCE)
    path = os.pathsep.join([str(tmp_path / "mods"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "HETERORL_TOKEN": TOKEN, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    procs = Processes(env, tmp_path / "logs")
    yield procs
    procs.kill_all()


def wait_until(condition: Callable[[], object], procs: Processes, timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.check_alive()
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def status(url: str) -> dict:
    try:
        with urllib.request.urlopen(url + "/v1/status", timeout=2) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return {}


def acked(procs: Processes, *names: str) -> set[str]:
    return {
        e["group_id"]
        for n in names
        for e in read_events(procs.log(n), "pushed")
        if e["outcome"] in ("accepted", "duplicate")
    }


def state_group_ids(run: Path) -> tuple[set[str], set[str]]:
    """(consumed, queued) group ids of the newest learner state on disk."""
    path = latest_state(run / "live" / "state")
    assert path is not None
    meta = json.loads((path / "state.json").read_text())
    limits = GroupLimits(vocab_size=2**31 - 1, current_version=2**31 - 1)
    queued = {decode_group(m, limits).group_id for m in read_records(path / "queue.records", meta["queue_count"])}
    return set(meta["extra"]["consumed_ids"]), queued


def test_live_processes_survive_killed_sampler_and_learner(
    tmp_path: Path, tiny_model_dir: Path, processes: Processes
) -> None:
    cfg = tiny_config(
        tiny_model_dir,
        "task.reward=heterorl_live_proc_reward:length",
        "cluster.samplers=[{name: a, link: {rollout_delay: {kind: fixed, seconds: 0.1}}}, {name: b}]",
        "learner.steps=8",
        "weights.codec=pulse",
        "live.emulate_links=true",  # paces sampler a, so the kills land mid-run
        "live.checkpoint_every=1",
        "live.poll_seconds=1",
        "live.backoff_initial_s=0.05",
        "live.backoff_max_s=0.5",
        "live.linger_s=5",
    )
    config, run = tmp_path / "config.yaml", tmp_path / "run"
    config.write_text(config_to_yaml(cfg))
    address = run / "live" / "learner.json"
    procs = processes
    learner = procs.start("learner-1", "learner", str(config), "--listen", "127.0.0.1:0", "--run-dir", str(run))
    a = procs.start("a-1", "sampler", str(config), "--connect-file", str(address), "--index", "0")
    procs.start("b-1", "sampler", str(config), "--connect-file", str(address), "--index", "1")
    wait_until(address.is_file, procs, 120, "the learner to listen")
    url = json.loads(address.read_text())["url"]
    wait_until(lambda: status(url).get("steps", 0) >= 2, procs, 120, "two steps")

    a.kill()  # SIGKILL: sync mode stalls without a's share until it is back
    a.wait()
    procs.start("a-2", "sampler", str(config), "--connect", url, "--index", "0")
    wait_until(lambda: acked(procs, "a-2") and status(url).get("steps", 0) >= 4, procs, 120, "a to rejoin")

    learner.kill()
    learner.wait()
    acked_before_kill = acked(procs, "a-1", "a-2", "b-1")
    path = latest_state(run / "live" / "state")
    assert path is not None
    state_version = int(path.name.split("-v")[1])
    port = url.rsplit(":", 1)[1]
    listen = f"127.0.0.1:{port}"
    resumed = procs.start("learner-2", "learner", str(config), "--listen", listen, "--run-dir", str(run), "--resume")
    assert resumed.wait(timeout=120) == 0, procs.log("learner-2").read_text()[-3000:]
    assert procs.procs["a-2"].wait(timeout=30) == 0
    assert procs.procs["b-1"].wait(timeout=30) == 0

    # the run completed with one record per step (the records of redone steps were cut on resume)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 8
    assert summary["resumes"] == 1
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"] == list(range(1, 9))

    # the resumed learner continued from the state on disk, with the very weights it had published then
    first, second = read_events(procs.log("learner-1")), read_events(procs.log("learner-2"))
    (resume_event,) = [e for e in second if e["event"] == "resumed"]
    assert resume_event["version"] == state_version >= 3  # killed at step >= 4, maybe before its checkpoint
    published_1 = {e["version"]: e["hash"] for e in first if e["event"] == "published"}
    republished = next(e for e in second if e["event"] == "published")
    assert republished["version"] == state_version
    assert republished["hash"] == published_1[state_version]

    # no acknowledged group was lost: each is trained, dropped by the window, or still queued
    consumed, queued = state_group_ids(run)
    assert acked_before_kill <= consumed | queued
    assert acked(procs, "a-1", "a-2", "b-1") <= consumed | queued

    # every weight version a sampler held (verified by hash) is one the learner published
    published = {(e["version"], e["hash"]) for e in first + second if e["event"] == "published"}
    for name in ("a-1", "a-2", "b-1"):
        held = {(e["version"], e["hash"]) for e in read_events(procs.log(name), "weights") if e["ok"]}
        assert held, name
        assert held <= published, name
    boots = {e["boot"] for n in ("a-1", "a-2") for e in read_events(procs.log(n), "started")}
    assert len(boots) == 2  # group ids of the restarted sampler cannot collide with the old ones
