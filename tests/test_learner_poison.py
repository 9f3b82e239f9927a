"""A group that would poison a learner step is dropped and named; the rest of the batch trains exactly as if it had
never been there (same weights and AdamW moments, bit for bit), so one sampler cannot make the learner skip steps."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from heterorl.learner import Learner
from heterorl.policy import Policy, SamplingParams
from heterorl.rollout import RolloutGroup
from heterorl.sampler import Sampler
from heterorl.tasks import make_task


@pytest.fixture(scope="module")
def groups(tiny_model_dir: Path) -> list[RolloutGroup]:
    """8 sampled groups of 4 with rewards set by hand (a random tiny model gets none right): 1, 0, 0, 1."""
    cfg = tiny_config(tiny_model_dir)
    sampler = Sampler.from_policy(
        "s0", Policy.load(tiny_model_dir), make_task(cfg.task), SamplingParams.from_config(cfg.sampler), 4, seed=1
    )
    learner = Learner(Policy.load(tiny_model_dir), cfg)
    sampler.load_weights(0, learner.export_weights())
    out = sampler.generate_groups(8)
    for g in out:
        g.rewards_G = torch.tensor([1.0, 0.0, 0.0, 1.0])
    return out


def poisoned(group: RolloutGroup) -> RolloutGroup:
    """One token of a row with a negative advantage claimed at log-prob -70 (inside the intake's -104 bound): its
    ratio exp(logp + 70) ~ 1e29 makes the group's own gradient norm overflow float32."""
    bad = copy.deepcopy(group)
    bad.group_id += "-poison"
    bad.behavior_logp_GL[1, 0] = -70.0
    return bad


def learner_state(learner: Learner) -> dict[str, torch.Tensor]:
    state = {f"w.{k}": v.detach().clone() for k, v in learner.policy.model.named_parameters()}
    for i, entries in learner.optimizer.state_dict()["state"].items():
        state.update({f"opt.{i}.{k}": v.clone() for k, v in entries.items() if isinstance(v, torch.Tensor)})
    return state


def assert_same(a: Learner, b: Learner) -> None:
    sa, sb = learner_state(a), learner_state(b)
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize("updates", [1, 2])
def test_a_poisoned_group_is_dropped_and_the_rest_trains_as_without_it(tiny_model_dir, groups, updates) -> None:
    cfg = tiny_config(tiny_model_dir, f"learner.updates_per_batch={updates}")
    attacked, clean = Learner(Policy.load(tiny_model_dir), cfg), Learner(Policy.load(tiny_model_dir), cfg)
    bad = poisoned(groups[1])
    g0, g2, g3 = groups[0], groups[2], groups[3]
    # updates=2: minibatches [g0, g2] and [g3, bad] against [g0, g2] and [g3] (arange(n).chunk(2))
    stats = attacked.train_step([g0, bad, g2, g3] if updates == 1 else [g0, g2, g3, bad])
    reference = clean.train_step([g0, g2, g3])
    assert [g.group_id for g in attacked.dropped] == [bad.group_id]
    assert (stats["learner/poisoned_groups"], stats["opt/skipped_updates"]) == (1.0, 0.0)
    assert reference["learner/poisoned_groups"] == 0.0
    assert_same(attacked, clean)  # weights and AdamW moments, bit for bit
    assert stats["obj/loss"] == reference["obj/loss"]
    assert attacked.version == clean.version == 1


def test_the_poison_is_what_the_issue_measured_a_non_finite_step(tiny_model_dir, groups) -> None:
    """Without its culprit search (several ranks), the same batch skips the whole step."""
    cfg = tiny_config(tiny_model_dir)
    learner = Learner(Policy.load(tiny_model_dir), cfg)
    learner.shard.world = 2  # the culprit search runs in one process only
    before = learner_state(learner)
    stats = learner.train_step([groups[0], poisoned(groups[1]), groups[2], groups[3]])
    assert stats["opt/skipped_updates"] == 1.0
    assert not learner.dropped
    after = learner_state(learner)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_without_dropping_the_poison_skips_the_whole_step(tiny_model_dir, groups) -> None:
    """`learner.drop_poisoned_groups: false` is the behaviour before issue 25 (what the experiments compare with)."""
    cfg = tiny_config(tiny_model_dir, "learner.drop_poisoned_groups=false")
    learner = Learner(Policy.load(tiny_model_dir), cfg)
    before = learner_state(learner)
    stats = learner.train_step([groups[0], poisoned(groups[1]), groups[2], groups[3]])
    assert (stats["opt/skipped_updates"], stats["learner/poisoned_groups"]) == (1.0, 0.0)
    after = learner_state(learner)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_batch_of_poison_only_applies_nothing(tiny_model_dir, groups) -> None:
    """No group of the minibatch is finite alone: the learner cannot tell poison from its own fault, so it drops
    and charges nobody, and applies nothing (today's guard)."""
    cfg = tiny_config(tiny_model_dir)
    learner = Learner(Policy.load(tiny_model_dir), cfg)
    before = learner_state(learner)
    stats = learner.train_step([poisoned(g) for g in groups[:4]])
    assert stats["opt/skipped_updates"] == 1.0
    assert not learner.dropped
    after = learner_state(learner)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_non_finite_step_no_group_explains_is_still_skipped(tiny_model_dir, groups) -> None:
    """Each group finite alone, but the learner's own weights hold an inf: nothing to drop, nothing applied."""
    cfg = tiny_config(tiny_model_dir)
    learner = Learner(Policy.load(tiny_model_dir), cfg)
    with torch.no_grad():
        next(iter(learner.policy.model.parameters())).view(-1)[0] = float("inf")
    stats = learner.train_step(groups[:4])
    assert stats["opt/skipped_updates"] == 1.0
    assert not learner.dropped  # no sampler is blamed for the learner's own fault
