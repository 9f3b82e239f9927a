"""Durability: a restored learner continues bit for bit, states are written atomically, the journal survives a
torn tail, and a learner rebuilt from state + journal holds every acknowledged group exactly once."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from heterorl.durable.journal import Journal, read_segment, segment_indices
from heterorl.durable.state import latest_state, restore_learner_state, save_learner_state
from heterorl.eventlog import EventLog
from heterorl.live.learner_node import LiveLearner, open_learner
from heterorl.live.preflight import LiveSetupError
from heterorl.rollout import pack_groups
from heterorl.rollout_codec import encode_group
from heterorl.run.build import build_learner
from heterorl.weights import state_hash
from transport.test_service import REWARD, make_live, sample_groups, varied_reward  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("varied_reward")


def resume_live(live: LiveLearner) -> LiveLearner:
    """What `heterorl learner --resume` does, in process."""
    assert live.cfg.model.path is not None
    return open_learner(live.cfg, live.run_dir, live.cfg.model.path, resume=True, events=EventLog(io.StringIO()))


def test_a_restored_learner_continues_bit_for_bit(tmp_path: Path, tiny_model_dir: Path) -> None:
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, "learner.warmup_steps=3", "learner.schedule=cosine")
    groups = sample_groups(live, tiny_model_dir, 8)
    for _ in range(2):
        live.loop.learner.train_step(groups[:4])
    path = save_learner_state(
        live.loop.learner, tmp_path / "state", queue=[encode_group(groups[5])], extra={"k": [1, 2]}
    )
    rng_after_save = torch.rand(3)
    copy = build_learner(live.cfg, str(tiny_model_dir))
    saved = restore_learner_state(copy, path)
    assert torch.equal(torch.rand(3), rng_after_save)  # the torch RNG continues where it was saved
    assert (saved.version, saved.extra, saved.queue) == (2, {"k": [1, 2]}, [encode_group(groups[5])])
    assert state_hash(copy.export_weights()) == state_hash(live.loop.learner.export_weights())
    assert copy.scheduler.get_last_lr() == live.loop.learner.scheduler.get_last_lr()
    live.loop.learner.train_step(groups[4:])
    copy.train_step(groups[4:])
    original = dict(live.loop.learner.policy.model.named_parameters())
    for name, p in copy.policy.model.named_parameters():
        assert torch.equal(p, original[name]), name  # same optimizer moments, same step count, same lr
    assert copy.version == live.loop.learner.version == 3


def test_states_are_replaced_atomically(tmp_path: Path, tiny_model_dir: Path) -> None:
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD)
    root = tmp_path / "state"
    first = save_learner_state(live.loop.learner, root, queue=[], extra={})
    (root / ".tmp-s00000009-v00000009-1").mkdir()  # a save killed half-way is never picked
    live.loop.learner.version = 5
    second = save_learner_state(live.loop.learner, root, queue=[], extra={})
    assert latest_state(root) == second
    assert not first.exists()
    assert second.name == "s00000001-v00000005"


def test_journal_keeps_intact_records_and_stops_at_a_torn_tail(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", fsync=True)
    journal.append(b"one")
    journal.append(b"two")
    segment = journal.rotate()
    journal.append(b"three")
    journal.close()
    path = tmp_path / "j" / f"{segment:08d}.journal"
    path.write_bytes(path.read_bytes() + b"\x05\x00\x00\x00partial")  # killed mid-append
    assert read_segment(path) == [b"three"]
    reopened = Journal(tmp_path / "j", fsync=False)  # appends go to a fresh segment, never a torn one
    assert reopened.segment == segment + 1
    assert list(reopened.replay(0)) == [b"one", b"two", b"three"]
    assert list(reopened.replay(segment)) == [b"three"]
    reopened.prune(segment)
    assert segment_indices(tmp_path / "j") == [segment, segment + 1]


def test_resume_rebuilds_the_queue_from_state_and_journal(tmp_path: Path, tiny_model_dir: Path) -> None:
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD)
    groups = sample_groups(live, tiny_model_dir, 9)
    messages = [encode_group(g) for g in groups]
    for body in messages[:6]:
        assert live.loop.intake.accept(body, 0).outcome == "accepted"
    taken = live.loop.intake.take(4, live.loop.learner.version, timeout=0)
    assert taken is not None
    live.loop.learner.train_step(taken[0])
    live.loop.publish()
    live.checkpoint()  # holds: version 1, groups 0-3 consumed, groups 4-5 queued
    for body in messages[6:]:
        assert live.loop.intake.accept(body, 1).outcome == "accepted"  # journaled after the checkpoint
    live.loop.intake.journal.close()  # the process dies here: no further checkpoint

    resumed = resume_live(live)
    ids = [g.group_id for g in groups]
    assert resumed.loop.learner.version == 1
    assert set(resumed.loop.intake.consumed) == set(ids[:4])
    assert [g.group_id for g in resumed.loop.intake.buffer.groups] == ids[4:]
    assert resumed.loop.intake.counters.accepted == 9
    assert state_hash(resumed.loop.learner.export_weights()) == live.loop.store.latest_hash
    for body in (messages[0], messages[5], messages[8]):  # consumed, checkpointed, journaled
        assert resumed.loop.intake.accept(body, 1).outcome == "duplicate"
    assert len(resumed.loop.intake.buffer) == 5


def test_a_resumed_learner_accepts_groups_of_versions_it_served_before(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Samplers still generating with a version the killed learner had served are not forgers: the resumed
    learner, about to reproduce that version, accepts their groups; a version never served is still refused."""
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD)
    groups = sample_groups(live, tiny_model_dir, 12)
    live.checkpoint()  # version 0
    for batch in (groups[0:4], groups[4:8]):
        for g in batch:
            assert live.loop.offer(encode_group(g)).outcome == "accepted"
        taken = live.loop.take()
        assert taken is not None
        live.loop.commit(live.loop.train(taken), busy_seconds=0.0)
    assert live.loop.published_version == 2  # served up to version 2, then killed without a state after v0
    live.loop.publisher.close()
    live.loop.intake.journal.close()

    resumed = resume_live(live)
    assert resumed.loop.learner.version == 0
    resumed.loop.start()
    at_v2, at_v3 = groups[8], groups[9]
    at_v2.version_GL.fill_(2)
    at_v3.version_GL.fill_(3)
    assert resumed.loop.offer(encode_group(at_v2)).outcome == "accepted"
    assert resumed.loop.offer(encode_group(at_v3)).outcome == "future_version"
    assert resumed.loop.intake.counters.rejected == {"future_version": 1}
    resumed.loop.publisher.close()


@pytest.mark.parametrize(
    "lora", ["model.lora={rank: 4, target_modules: [q_proj, v_proj], publish: adapter}", None], ids=["lora", "full"]
)
def test_a_resumed_learner_keeps_its_base_and_kl_reference(tmp_path: Path, tiny_model_dir: Path, lora: str | None):
    """Restored from the base model plus the saved trainable weights: with LoRA the same adapters on the same
    base (what samplers holding the base apply), and in both cases the KL reference is the run's base model."""
    options = ["objective.ref_kl_beta=0.1", "learner.lr=5e-2", *([lora] if lora else [])]
    plain = make_live(tmp_path / "plain", tiny_model_dir, REWARD)  # samples with the base weights
    groups = sample_groups(plain, tiny_model_dir, 12)
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, *options)
    learner = live.loop.learner
    for batch in (groups[0:4], groups[4:8]):
        learner.train_step(batch)
    path = save_learner_state(learner, tmp_path / "state", queue=[], extra={})
    copy = build_learner(live.cfg, str(tiny_model_dir))
    restore_learner_state(copy, path)
    exported, restored = learner.export_weights(), copy.export_weights()
    assert exported.keys() == restored.keys()
    assert all(torch.equal(exported[k], restored[k]) for k in exported)  # what samplers are sent, bit for bit
    fresh = build_learner(live.cfg, str(tiny_model_dir))
    batch = pack_groups(groups[8:12], learner.policy.pad_id)
    reference = fresh._ref_logp(batch)
    assert not torch.equal(learner._logp(batch), reference)  # training moved the policy away from the base
    assert torch.equal(copy._ref_logp(batch), reference)  # the reference is still the base model
    learner.train_step(groups[8:12])
    copy.train_step(groups[8:12])
    original = dict(learner.policy.model.named_parameters())
    for name, p in copy.policy.model.named_parameters():
        assert torch.equal(p, original[name]), name


def test_a_state_of_another_format_is_one_clear_error(tmp_path: Path, tiny_model_dir: Path) -> None:
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD)
    path = live.checkpoint()
    meta = json.loads((path / "state.json").read_text())
    (path / "state.json").write_text(json.dumps({**meta, "format": 1}))  # written by an older heterorl
    live.loop.intake.journal.close()
    with pytest.raises(LiveSetupError, match=r"--resume: .*state format 1"):
        resume_live(live)
