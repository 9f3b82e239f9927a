"""The learner's intake refuses what would poison training or is wrong though well-formed, counts it, and keeps
training on the rest: log-probs below what a sampler can emit, rewards out of bounds, prompt + completion over the
model's context, empty ids, a reused id with other content, over-long texts, unknown info counts."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from heterorl.live.learner_node import LiveLearner
from heterorl.loop.intake import body_digest
from heterorl.rollout import RolloutGroup
from heterorl.rollout_codec import encode_group
from heterorl.transport.http.status import status_of
from transport.test_service import REWARD, make_live, sample_groups, varied_reward  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("varied_reward")


@pytest.fixture
def live(tmp_path: Path, tiny_model_dir: Path) -> LiveLearner:
    # the intake's own checks: the verifier (which re-scores a keyed, per-process random share of groups and would
    # refuse the forged log-probs below as logprob_mismatch) is tested in tests/loop/test_screen.py
    return make_live(tmp_path / "run", tiny_model_dir, REWARD, "trust.verify.fraction=0")


def variant(group: RolloutGroup, change: Callable[[RolloutGroup], None], suffix: str = "-v") -> bytes:
    bad = copy.deepcopy(group)
    bad.group_id += suffix
    change(bad)
    return encode_group(bad)


def set_logp(value: float, where: tuple[int, int] | None = (0, 0)) -> Callable[[RolloutGroup], None]:
    def change(g: RolloutGroup) -> None:
        if where is None:
            g.behavior_logp_GL[g.completion_mask_GL.bool()] = value
        else:
            g.behavior_logp_GL[where] = value

    return change


def set_reward(value: float) -> Callable[[RolloutGroup], None]:
    def change(g: RolloutGroup) -> None:
        g.rewards_G[1] = value

    return change


def test_groups_that_would_poison_training_are_refused_and_training_stays_finite(
    live: LiveLearner, tiny_model_dir: Path
) -> None:
    groups = sample_groups(live, tiny_model_dir, 8)
    poison = [
        ("bad_logprobs", variant(groups[0], set_logp(-1e4), "-a")),  # one token: exp(1e4) = inf ratio
        ("bad_logprobs", variant(groups[1], set_logp(-3e38, where=None), "-b")),
        ("bad_logprobs", variant(groups[2], set_logp(-104.5), "-c")),  # below what float32 sampling can emit
        ("bad_rewards", variant(groups[3], set_reward(3e38), "-d")),
        ("bad_rewards", variant(groups[0], set_reward(-3e38), "-e")),
        ("bad_rewards", variant(groups[1], set_reward(1e5), "-f")),
    ]
    for reason, body in poison:
        assert live.loop.offer(body).outcome == reason
    for g in groups[4:8]:
        assert live.loop.offer(encode_group(g)).outcome == "accepted"
    # a token a float32 sampler can (just) emit is accepted: guarding what it does to training is the learner's job
    assert live.loop.offer(variant(groups[2], set_logp(-103.5), "-g")).outcome == "accepted"
    assert live.loop.intake.counters.rejected == {"bad_logprobs": 3, "bad_rewards": 3}
    taken = live.loop.take()
    assert taken is not None
    assert [g.group_id for g in taken.groups] == [g.group_id for g in groups[4:8]]
    live.loop.commit(live.loop.train(taken), busy_seconds=0.0)
    assert all(torch.isfinite(p).all() for p in live.loop.learner.policy.model.parameters())


def test_prompt_plus_completion_over_the_models_context_is_too_long(live: LiveLearner, tiny_model_dir: Path) -> None:
    (group,) = sample_groups(live, tiny_model_dir, 1)
    context = live.loop.learner.policy.model.config.max_position_embeddings
    text = live.loop.learner.policy.text
    long_prompt = "1+2=" * ((context - 1) // 4) + "1" * ((context - 1) % 4)  # context - 1 tokens

    def lengthen(g: RolloutGroup) -> None:
        g.prompt = long_prompt
        g.prompt_ids_P = torch.tensor(text.prompt_ids(long_prompt))

    assert len(text.prompt_ids(long_prompt)) == context - 1
    assert group.completion_ids_GL.shape[1] >= 2  # so prompt + completion > context
    verdict = live.loop.offer(variant(group, lengthen))
    assert (status_of(verdict.outcome), verdict.outcome) == (422, "too_long")


def test_texts_ids_and_info_are_bounded(live: LiveLearner, tiny_model_dir: Path) -> None:
    (group,) = sample_groups(live, tiny_model_dir, 1)

    def long_answer(g: RolloutGroup) -> None:
        g.answer = "7" * 60_000

    def long_prompt_text(g: RolloutGroup) -> None:  # far more characters than its few prompt ids could come from
        g.prompt = g.prompt + " " * 60_000

    def empty_id(g: RolloutGroup) -> None:
        g.group_id = ""

    def long_sampler_id(g: RolloutGroup) -> None:
        g.sampler_id = "s" * 5000

    def made_up_info(g: RolloutGroup) -> None:
        g.info = {f"k{i}": 0 for i in range(16)}

    cases = [
        ("too_long", 422, long_answer),
        ("too_long", 422, long_prompt_text),
        ("invalid", 422, empty_id),
        ("invalid", 422, long_sampler_id),
        ("invalid", 422, made_up_info),
    ]
    for reason, status, change in cases:
        verdict = live.loop.offer(variant(group, change))
        assert (status_of(verdict.outcome), verdict.outcome) == (status, reason), change.__name__
    assert live.loop.intake.counters.info == {}
    assert dict(live.loop.intake.counters.rejected) == {"too_long": 2, "invalid": 3}


def test_a_reused_group_id_with_other_content_is_a_conflict(live: LiveLearner, tiny_model_dir: Path) -> None:
    groups = sample_groups(live, tiny_model_dir, 5)
    bodies = [encode_group(g) for g in groups]
    for body in bodies[:4]:
        assert live.loop.offer(body).outcome == "accepted"
    taken = live.loop.take()  # groups 0-3 consumed
    assert taken is not None
    assert live.loop.offer(bodies[4]).outcome == "accepted"  # queued

    def other_rewards(g: RolloutGroup) -> None:
        g.rewards_G = g.rewards_G + 1

    for group, body in ((groups[0], bodies[0]), (groups[4], bodies[4])):  # consumed, queued
        retried = live.loop.offer(body, body_digest(body))
        assert (status_of(retried.outcome), retried.outcome) == (200, "duplicate")
        impostor = live.loop.offer(variant(group, other_rewards, suffix=""))
        assert (status_of(impostor.outcome), impostor.outcome) == (409, "id_conflict")
    counters = live.loop.intake.counters
    assert (counters.accepted, counters.duplicates, counters.rejected["id_conflict"]) == (5, 2, 2)
    assert [g.group_id for g in live.loop.intake.buffer.groups] == [groups[4].group_id]
