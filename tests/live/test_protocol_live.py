"""The conversation's rules with real processes on the wall clock (the simulated clock runs the same session:
tests/simulated/test_protocol.py): with `cluster.eta` set, uploads lost on an emulated link and a sampler
SIGKILLed while it holds admission slots, the learner still reaches its last step -- the dead sampler's lease
runs out and its slots come back."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from conftest import tiny_config
from heterorl.config import config_to_yaml
from heterorl.eventlog import read_events
from live.test_processes import Processes, processes, status, wait_until  # noqa: F401 (a fixture)

pytestmark = pytest.mark.processes  # `make test-processes`


def test_lost_uploads_and_a_sampler_killed_holding_slots_do_not_stop_the_run(
    tmp_path: Path,
    tiny_model_dir: Path,
    processes: Processes,  # noqa: F811
) -> None:
    lossy = "{rollout_faults: {drop: 0.3}}"
    # a's uploads wait 0.5 s in its own process (the emulated link) before they leave: stopped there, they never
    # land, so the slots they hold stay outstanding (on a quiet machine an undelayed upload landed within the
    # second the test waits, every time, until the 8 steps were over)
    slow = "{rollout_delay: {kind: fixed, seconds: 0.5}}"
    cfg = tiny_config(
        tiny_model_dir,
        "task.reward=heterorl_live_proc_reward:length",
        f"cluster.samplers=[{{name: a, link: {slow}}}, {{name: b, link: {lossy}}}]",
        "cluster.mode=async",
        "cluster.eta=0",  # a version's budget is one batch: slots held by the dead sampler would block it
        "cluster.lease_seconds=3",
        "learner.steps=8",
        "live.emulate_links=true",
        "live.dead_after_s=1",
        "live.poll_seconds=0.5",
        "live.backoff_initial_s=0.05",
        "live.backoff_max_s=0.3",
    )
    config, run = tmp_path / "config.yaml", tmp_path / "run"
    config.write_text(config_to_yaml(cfg))
    address = run / "live" / "learner.json"
    learner = processes.start("learner", "learner", str(config), "--listen", "127.0.0.1:0", "--run-dir", str(run))
    a = processes.start("a", "sampler", str(config), "--connect-file", str(address), "--index", "0")
    processes.start("b", "sampler", str(config), "--connect-file", str(address), "--index", "1")
    wait_until(address.is_file, processes, 120, "the learner to listen")
    url = json.loads(address.read_text())["url"]

    def a_holds_slots() -> bool:
        if learner.poll() is not None:
            pytest.fail("the run ended before sampler a was caught holding slots")
        granted = status(url).get("admission", {}).get("a", {})
        return granted.get("outstanding", 0) > 0

    for _ in range(20):  # kill it while it surely holds slots: stopped, with nothing of it still on the way
        wait_until(a_holds_slots, processes, 120, "sampler a to hold admission slots")
        a.send_signal(signal.SIGSTOP)
        time.sleep(1.0)  # an upload already sent lands (and may cover its slots)
        if a_holds_slots():
            break
        a.send_signal(signal.SIGCONT)
    a.kill()
    killed_at = time.monotonic()
    assert learner.wait(timeout=240) == 0, processes.log("learner").read_text()[-3000:]
    assert time.monotonic() - killed_at < 200
    (finished,) = read_events(processes.log("learner"), "finished")
    assert finished["version"] == 8
    final = json.loads((run / "summary.json").read_text())
    assert final["admission"]["voided"] > 0  # the killed sampler's slots came back when its lease ran out
    b_done = read_events(processes.log("b"), "finished")
    assert b_done
    assert b_done[0]["transport"]["emulated_drop"] >= 1  # b's uploads were lost and sent again
