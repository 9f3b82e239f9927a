"""A live run through the store as real processes on loopback: a learner and two samplers that never talk to each
other (the samplers get no URL), only to the store -- moto's S3 server and a file:// directory. The learner
trains every step on groups that came through the store, every weight version a sampler held is bit-identical to
one the learner published (state hashes), each sampler held every version (sync mode), the learner uploaded each
version once, and the samplers stopped on the store's `finished` marker."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import tiny_config
from heterorl.config import config_to_yaml
from heterorl.eventlog import read_events
from heterorl.metrics import read_metrics
from live.test_processes import Processes, processes  # noqa: F401 (a fixture)

pytestmark = pytest.mark.processes  # separate OS processes, 18-26 s each: `make test-processes`


def test_a_learner_and_two_samplers_train_through_the_store_only(
    tmp_path: Path,
    tiny_model_dir: Path,
    store_overrides: list[str],
    processes: Processes,  # noqa: F811
) -> None:
    cfg = tiny_config(
        tiny_model_dir,
        "task.reward=heterorl_live_proc_reward:length",
        "cluster.samplers=[{name: a}, {name: b}]",
        "learner.steps=6",
        "weights.codec=pulse",
        "transport.weights=store",
        "transport.rollouts=store",
        "transport.store.poll_seconds=0.1",
        "live.poll_seconds=1",
        "live.backoff_initial_s=0.05",
        "live.backoff_max_s=0.5",
        "live.checkpoint_every=3",
        *store_overrides,
    )
    config, run = tmp_path / "config.yaml", tmp_path / "run"
    config.write_text(config_to_yaml(cfg))
    assert "testing" not in config.read_text()  # credentials stay in the environment
    procs = processes
    procs.env.update({k: v for k, v in os.environ.items() if k.startswith("AWS_")})
    learner = procs.start("learner", "learner", str(config), "--listen", "127.0.0.1:0", "--run-dir", str(run))
    samplers = [procs.start(n, "sampler", str(config), "--index", str(i)) for i, n in enumerate("ab")]
    assert learner.wait(timeout=300) == 0, procs.log("learner").read_text()[-3000:]
    for name, proc in zip("ab", samplers, strict=True):
        assert proc.wait(timeout=60) == 0, procs.log(name).read_text()[-3000:]

    records = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in records] == list(range(1, 7))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["net"]["accepted"] == 6 * 4  # every trained group came through the store
    assert summary["net"]["rejected"] == {}

    events = read_events(procs.log("learner"))
    published = {(e["version"], e["hash"]) for e in events if e["event"] == "published"}
    uploaded = [e["version"] for e in events if e["event"] == "uploaded"]
    assert sorted(uploaded) == list(range(7))  # each version uploaded once, whatever the samplers
    assert summary["weight_bytes_sent"] == sum(e["bytes"] for e in events if e["event"] == "uploaded")
    for name in "ab":
        held = [(e["version"], e["hash"]) for e in read_events(procs.log(name), "weights") if e["ok"]]
        assert set(held) <= published  # bit-identical to what the learner published
        assert [v for v, _ in held] == list(range(7))  # sync mode: every version, in order
        (started,) = read_events(procs.log(name), "started")
        assert started["url"] is None  # never talked to the learner
        (finished,) = read_events(procs.log(name), "finished")
        assert finished["outcomes"]["accepted"] == 6 * 2  # its share of every batch
    (done,) = [e for e in events if e["event"] == "store_finished"]
    assert done["ok"]
