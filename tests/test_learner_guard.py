"""The learner never applies a non-finite update, whatever reaches it: a step whose gradient is inf/NaN leaves the
weights and AdamW's moments bit for bit as they were, is counted, keeps its groups out, and too many in a row stop
the run with one clear error (the state saved, so it resumes once the source is fixed)."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import pytest
import torch

from heterorl.durable.state import latest_state
from heterorl.eventlog import EventLog
from heterorl.loop.learner_loop import TrainingDivergedError
from heterorl.metrics import read_metrics
from heterorl.rollout import RolloutGroup
from heterorl.rollout_codec import encode_group
from transport.test_service import REWARD, make_live, sample_groups, varied_reward  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("varied_reward")


def poisoned(group: RolloutGroup, tag: str) -> RolloutGroup:
    """A group the intake accepts (a log-prob float32 sampling can just emit) whose ratio exp(~100) is inf."""
    bad = copy.deepcopy(group)
    bad.group_id += f"-poison-{tag}"
    bad.behavior_logp_GL[0, 0] = -103.5
    return bad


def snapshot(learner) -> dict[str, torch.Tensor]:
    state = {f"w.{k}": v.detach().clone() for k, v in learner.policy.model.named_parameters()}
    for i, entries in learner.optimizer.state_dict()["state"].items():
        state.update({f"opt.{i}.{k}": v.clone() for k, v in entries.items() if isinstance(v, torch.Tensor)})
    return state


def test_a_non_finite_step_changes_nothing_and_is_counted(tmp_path: Path, tiny_model_dir: Path) -> None:
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD)
    learner = live.loop.learner
    groups = sample_groups(live, tiny_model_dir, 8)
    first = learner.train_step(groups[:4])  # AdamW has moments now
    assert first["opt/skipped_updates"] == 0
    before = snapshot(learner)
    stats = learner.train_step([poisoned(groups[4], "a"), *groups[5:8]])
    assert stats["opt/skipped_updates"] == 1
    assert not torch.isfinite(torch.tensor(stats["opt/grad_norm"]))
    after = snapshot(learner)
    for name, value in before.items():
        assert torch.equal(value, after[name]), name  # weights and moments untouched, bit for bit
    assert learner.version == 2
    assert learner.train_step(groups[4:8])["opt/skipped_updates"] == 0  # and training goes on


def test_skipped_steps_are_recorded_and_too_many_in_a_row_stop_the_learner(tmp_path: Path, tiny_model_dir: Path):
    log = io.StringIO()
    live = make_live(
        tmp_path / "run",
        tiny_model_dir,
        REWARD,
        "learner.max_skipped_steps=2",
        "learner.steps=10",
        events=EventLog(log),
    )
    groups = sample_groups(live, tiny_model_dir, 16)
    batches = [
        groups[0:4],  # a good step
        [poisoned(groups[4], "a"), *groups[5:8]],  # skipped
        groups[8:12],  # good: the streak starts again
        [poisoned(g, "b") for g in groups[12:16]],  # skipped
        [poisoned(g, "c") for g in groups[0:4]],  # skipped: 2 in a row
    ]
    for batch in batches:
        for g in batch:
            assert live.loop.offer(encode_group(g)).outcome == "accepted"
    with pytest.raises(TrainingDivergedError, match="2 learner steps in a row"):
        live.train()
    train = [r for r in read_metrics(live.run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["learner/skipped_steps"] for r in train] == [0, 1, 1, 2, 3]
    assert [r["opt/skipped_updates"] for r in train] == [0, 1, 0, 1, 1]
    assert len(live.loop.intake.buffer) == 0
    assert sum("-poison-" in gid for gid in live.loop.intake.consumed) == 9  # consumed: they never come back
    weights = live.loop.learner.policy.model.parameters()
    assert all(torch.isfinite(p).all() for p in weights)
    state = latest_state(live.run_dir / "live" / "state")  # saved at the stop: resumable
    assert state is not None
    assert state.name.endswith(f"-v{5:08d}")
    events = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [e["version"] for e in events if e["event"] == "skipped_step"] == [2, 4]
    assert events[-1]["event"] == "stopped"
    live.loop.intake.journal.close()
