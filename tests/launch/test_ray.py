"""`heterorl run --ray` on a local Ray (2 CPUs): the learner and 2 samplers as actors learn on the smoke config
(60 steps, where the reward climbs well above the step-to-step noise), and a sampler actor killed mid-run is
restarted by Ray, rejoins (sync mode waits for its share) and is counted."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import smoke_config, tiny_config
from heterorl.launch.ray import run_ray
from heterorl.metrics import read_metrics

pytestmark = pytest.mark.ray  # the ray tier (`make test-ray` installs the extra); never skipped there


@pytest.fixture
def local_ray() -> Iterator[Any]:
    import ray

    ray.init(num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _steps(run: Path) -> int:
    path = run / "metrics.jsonl"
    return path.read_text().count('"kind": "train"') if path.is_file() else 0


@pytest.mark.ray
def test_a_ray_run_learns_and_survives_a_killed_sampler(tmp_path: Path, local_ray: Any) -> None:
    cfg = smoke_config(
        "cluster.samplers=[{name: a}, {name: b}]",
        "ray.learner.actor.num_cpus=0.5",  # 3 actors on 2 CPUs
        "ray.samplers=[{num_cpus: 0.5}]",
        "live.fsync=false",
        "learner.steps=60",
        "eval.every=60",
    )
    run = tmp_path / "run"
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(summary=run_ray(cfg, run, show_progress=False)))
    thread.start()
    deadline = time.monotonic() + 400
    while _steps(run) < 10 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    killed_at = _steps(run)
    assert 10 <= killed_at < cfg.learner.steps - 10, "the kill must land mid-run"
    local_ray.kill(local_ray.get_actor(f"{run.name}:a", namespace=cfg.ray.namespace), no_restart=False)  # dies
    thread.join(timeout=400)
    assert not thread.is_alive()

    summary = result["summary"]
    assert summary["ray"] == {"sampler_restarts": {"a": 1, "b": 0}, "learner_ranks": 1}
    assert summary["steps"] == cfg.learner.steps  # in sync mode every step after the kill needed the new a's share
    rewards = [r["reward/mean"] for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.05, rewards  # the simulated run of this config: 0.23 -> 0.41
    assert summary["clock"] == "wall"
    assert (run / "checkpoint" / "config.json").is_file()


@pytest.mark.ray
def test_two_learner_ranks_as_ray_actors_train_the_single_process_run(tmp_path: Path, local_ray: Any) -> None:
    from safetensors.torch import load_file

    from heterorl.simulated.run import execute

    overrides = ("learner.steps=6", "eval.every=6", "learner.micro_batch_tokens=200", "live.fsync=false")
    ranks = ("ray.learner.ranks=2", "ray.learner.actor.num_cpus=0.5", "ray.learner.placement=PACK")
    cfg = smoke_config(*overrides, *ranks)
    summary = run_ray(cfg, tmp_path / "ray", show_progress=False)
    assert summary["ray"]["learner_ranks"] == 2
    execute(smoke_config(*overrides), tmp_path / "one", show_progress=False)  # sync, one sampler: the same data
    a = load_file(str(tmp_path / "one" / "checkpoint" / "model.safetensors"))
    b = load_file(str(tmp_path / "ray" / "checkpoint" / "model.safetensors"))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5


@pytest.mark.ray
def test_callbacks_run_in_the_driver_and_stop_finishes_the_ray_run(
    tmp_path: Path, local_ray: Any, tiny_model_dir: Path
) -> None:
    """The Trainer's callbacks under Ray: every record of the learner actor, in order, in this process; `stop()`
    reaches rank 0 through the board and the run ends after the step it was on, evaluated."""
    from heterorl import Callback, Trainer

    class StopAt(Callback):
        def __init__(self) -> None:
            self.seen: list[tuple[str, int]] = []

        def on_step(self, trainer: Trainer, record: dict[str, Any]) -> None:
            self.seen.append(("train", record["step"]))
            if record["step"] == 4:
                trainer.stop()

        def on_evaluate(self, trainer: Trainer, record: dict[str, Any]) -> None:
            self.seen.append(("eval", record["step"]))

    cfg = tiny_config(tiny_model_dir, "learner.steps=300", "eval.every=3", "ray.learner.actor.num_cpus=0.5")
    watcher = StopAt()
    summary = Trainer(cfg, run_dir=tmp_path / "run", callbacks=[watcher], show_progress=False).fit("live", "local")
    assert 4 <= summary["steps"] < 300
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert watcher.seen == [(r["kind"], r["step"]) for r in records]
    assert records[-1]["kind"] == "eval"
    assert records[-1]["step"] == summary["steps"]
