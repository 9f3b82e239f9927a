"""`run_live`: the local launcher writes the simulated mode's run directory and summary, and always ends its
child processes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import tiny_config
from heterorl.config import config_to_yaml, load_config
from heterorl.eventlog import read_events
from heterorl.live import launcher as live_module
from heterorl.live.launcher import LiveRunError, run_live
from heterorl.metrics import read_metrics

# the keys `heterorl run` prints (cli._print_summary)
SUMMARY_KEYS = (
    "accuracy_initial",
    "accuracy_final",
    "reward_first",
    "reward_last",
    "steps",
    "objective",
    "mode",
    "clock_seconds",
    "staleness_mean",
    "staleness_max",
    "groups_dropped",
    "tokens_per_clock_second",
    "sampler_idle",
    "learner_idle",
    "weight_bytes_sent",
    "weight_bytes_full",
    "wall_seconds",
    "rl_wall_seconds",
)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen[bytes]]:
    """Every child process run_live starts."""
    procs: list[subprocess.Popen[bytes]] = []
    original = live_module.ProcessGroup.start

    def start(self: live_module.ProcessGroup, name: str, args: list[str], log: Path, **kw) -> subprocess.Popen[bytes]:
        proc = original(self, name, args, log, **kw)
        procs.append(proc)
        return proc

    monkeypatch.setattr(live_module.ProcessGroup, "start", start)
    return procs


@pytest.mark.processes
def test_run_live_writes_the_run_directory_of_the_simulated_mode(
    tmp_path: Path, tiny_model_dir: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    cfg = tiny_config(tiny_model_dir, "cluster.samplers=[{name: a}, {name: b}]", "learner.steps=3")  # sync mode:
    # every step needs both samplers' shares, so both surely take part
    run = tmp_path / "run"
    summary = run_live(cfg, run, show_progress=False)
    assert all(p.poll() is not None for p in started)
    assert len(started) == 3
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary["steps"] == 3
    assert summary["mode"] == "sync"
    assert set(summary["sampler_idle"]) == {"a", "b"}
    assert summary["net"]["accepted"] >= 3 * cfg.learner.groups_per_step
    assert summary["wall_seconds"] >= summary["rl_wall_seconds"] > 0
    assert json.loads((run / "summary.json").read_text()) == summary
    assert load_config(run / "config.yaml") == cfg
    assert (run / "checkpoint" / "config.json").is_file()
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 3]
    for key in ("reward/mean", "obj/loss", "stale/mean", "sync/bytes", "perf/learner_idle", "net/rejected_malformed"):
        assert all(key in r for r in records if r["kind"] == "train"), key
    finished = [e for n in ("sampler-0", "sampler-1") for e in read_events(run / "live" / f"{n}.log", "finished")]
    assert len(finished) == 2  # both samplers heard the run was over and left on their own


@pytest.mark.processes
def test_run_live_ends_its_children_when_it_fails(
    tmp_path: Path, tiny_model_dir: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    cfg = tiny_config(tiny_model_dir, "live.startup_timeout_s=0.01")
    with pytest.raises(LiveRunError, match="did not listen"):
        run_live(cfg, tmp_path / "run", show_progress=False)
    assert len(started) == 2
    assert all(p.poll() is not None for p in started)


def test_config_round_trips_with_the_live_section(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_config(tiny_model_dir, "live.checkpoint_every=3", "live.token_env=MY_TOKEN")
    (tmp_path / "c.yaml").write_text(config_to_yaml(cfg))
    assert load_config(tmp_path / "c.yaml").live == cfg.live
    with pytest.raises(ValueError, match="backoff_initial_s"):
        tiny_config(tiny_model_dir, "live.backoff_initial_s=5", "live.backoff_max_s=1")
