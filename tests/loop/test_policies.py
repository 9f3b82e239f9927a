"""Loop policies under the simulated clock: backpressure, which groups a step takes, DAPO's dynamic sampling,
periodic and best checkpoints."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from conftest import capture_records, tiny_config
from heterorl.loop.staleness import RolloutBuffer
from heterorl.rollout import RolloutGroup
from heterorl.simulated.run import build_simulated, execute


def _group(version: int, gid: int) -> RolloutGroup:
    return RolloutGroup(
        group_id=str(gid),
        sampler_id="s",
        prompt="1+1=",
        answer="2",
        prompt_ids_P=torch.tensor([4, 13, 4, 15]),
        completion_ids_GL=torch.tensor([[5, 1]]),
        completion_mask_GL=torch.tensor([[1, 1]]),
        behavior_logp_GL=torch.tensor([[-0.1, -0.2]]),
        version_GL=torch.tensor([[version, version]]),
        rewards_G=torch.tensor([1.0]),
    )


def test_freshest_first_takes_the_newest_versions_and_keeps_the_rest_in_order() -> None:
    buffer = RolloutBuffer(consume="freshest")
    for i, v in enumerate([1, 3, 2, 3, 1]):
        buffer.add(_group(v, i))
    batch, stats = buffer.take(2, 4)
    assert [g.group_id for g in batch] == ["1", "3"]  # versions 3 and 3, in arrival order
    assert stats["stale/max"] == 1.0
    assert [g.group_id for g in buffer.groups] == ["0", "2", "4"]
    oldest = RolloutBuffer()
    for i, v in enumerate([1, 3, 2]):
        oldest.add(_group(v, i))
    assert [g.group_id for g in oldest.take(2, 4)[0]] == ["0", "1"]


def _fast_sampler_slow_learner(*extra: str) -> list[str]:
    return [
        "cluster.mode=async",
        "cluster.samplers=[{tokens_per_second: 100}]",
        "cluster.learner_step_seconds=10",
        "learner.steps=6",
        *extra,
    ]


def test_backpressure_bounds_what_fast_samplers_queue(tmp_path: Path, tiny_model_dir: Path) -> None:
    free = build_simulated(
        tiny_config(tiny_model_dir, *_fast_sampler_slow_learner("cluster.max_queued_steps=null")),
        tmp_path / "a",
        str(tiny_model_dir),
    )
    free_records = capture_records(free)
    free.run()
    bounded = build_simulated(
        tiny_config(tiny_model_dir, *_fast_sampler_slow_learner("cluster.max_queued_steps=2")),
        tmp_path / "b",
        str(tiny_model_dir),
    )
    records = capture_records(bounded)
    bounded.run()
    B = 4
    assert max(r["net/queue"] for r in free_records) > 10 * B  # unbounded: the queue runs away
    assert max(r["net/queue"] for r in records) <= 2 * B
    assert max(r["stale/max"] for r in records) < max(r["stale/max"] for r in free_records)


@pytest.fixture
def parity_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Reward = parity of the completion's length: a group of 4 is uniform about one time in eight."""
    (tmp_path / "parity_reward.py").write_text(
        "def parity(prompt, completion, answer, **info):\n    return float(len(completion) % 2)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "parity_reward", raising=False)
    return "task.reward=parity_reward:parity"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_dynamic_sampling_trains_only_informative_groups(tmp_path: Path, tiny_model_dir: Path, parity_reward, mode):
    cfg = tiny_config(
        tiny_model_dir, parity_reward, "learner.dynamic_sampling=true", f"cluster.mode={mode}", "learner.steps=8"
    )
    cluster = build_simulated(cfg, tmp_path, str(tiny_model_dir))
    records = capture_records(cluster)
    trained: list[RolloutGroup] = []
    original = cluster.loop.learner.train_step

    def spy(groups):
        trained.extend(groups)
        return original(groups)

    cluster.loop.learner.train_step = spy
    cluster.run()
    assert len(records) == 8  # sync mode generated the filtered groups again: every batch is full
    assert records[-1]["net/filtered_total"] > 0
    assert all(bool((g.rewards_G != g.rewards_G[0]).any()) for g in trained)


def test_periodic_and_best_checkpoints(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = tiny_config(tiny_model_dir, "checkpoint.every=2", "checkpoint.keep_last=2", "learner.steps=6", "eval.every=3")
    execute(cfg, tmp_path / "run", show_progress=False)
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["best", "step-00000004", "step-00000006"]
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    accuracies = {r["step"]: r["eval/accuracy"] for r in evals if r["kind"] == "eval" and r["step"] > 0}
    best = json.loads((root / "best" / "best.json").read_text())
    assert best["accuracy"] == max(accuracies.values())
    assert accuracies[best["step"]] == best["accuracy"]
    assert (root / "best" / "config.json").is_file()
    assert (tmp_path / "run" / "checkpoint" / "config.json").is_file()


def test_unbounded_fast_samplers_are_warned_about(tiny_model_dir: Path) -> None:
    from heterorl.simulated.cluster import overgeneration_warning

    cfg = tiny_config(tiny_model_dir, *_fast_sampler_slow_learner("cluster.max_queued_steps=null"))
    assert "set cluster.max_queued_steps" in overgeneration_warning(cfg)
    assert overgeneration_warning(tiny_config(tiny_model_dir, *_fast_sampler_slow_learner())) is None  # bounded
    assert overgeneration_warning(tiny_config(tiny_model_dir, "cluster.learner_step_seconds=10")) is None  # sync
