"""The learner recomputes a group's rewards from its own task and tokenizer: forged rewards, forged answers and
prompts the task would never draw are refused; honest groups get the same rewards back; a custom reward that says
it cannot be recomputed is taken as sent."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from heterorl.policy import TextFormat
from heterorl.rollout import RolloutGroup
from heterorl.tasks import Check, Problem, make_task
from heterorl.tasks.addition import AdditionTask
from heterorl.tasks.recheck import recheck_rewards
from heterorl.tokenizer import build_char_tokenizer

from ._configs import AdditionTaskConfig, MathTaskConfig, ReversalTaskConfig

TEXT = TextFormat(build_char_tokenizer())
DECODE = TEXT.decode_completions


def group(prompt: str, completions: list[str], rewards: list[float], answer: str = "") -> RolloutGroup:
    rows = [TEXT.encode_completion(c) for c in completions]
    L = max(len(r) for r in rows)
    ids = torch.full((len(rows), L), TEXT.pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), L), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
    return RolloutGroup(
        group_id="s0:1",
        sampler_id="s0",
        prompt=prompt,
        answer=answer,
        prompt_ids_P=torch.tensor(TEXT.prompt_ids(prompt)),
        completion_ids_GL=ids,
        completion_mask_GL=mask,
        behavior_logp_GL=-mask.float(),
        version_GL=torch.zeros_like(ids),
        rewards_G=torch.tensor(rewards, dtype=torch.float32),
    )


def a_training_prompt(task) -> str:
    return next(task.train_stream(0)).prompt


def test_honest_rewards_come_back_recomputed() -> None:
    task = make_task(AdditionTaskConfig(digits=2))
    prompt = a_training_prompt(task)
    a, b = prompt[:-1].split("+")
    right = str(int(a) + int(b))
    verdict = recheck_rewards(task, group(prompt, [right, "7", right, "x"], [1, 0, 1, 0]), DECODE)
    assert verdict.reason == ""
    assert verdict.rewards_G.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert task.stats()["checked"] == 0  # the learner's recheck is not a training verdict of the samplers


def test_forged_rewards_are_a_mismatch_with_the_first_one_named() -> None:
    task = make_task(AdditionTaskConfig(digits=2))
    prompt = a_training_prompt(task)
    verdict = recheck_rewards(task, group(prompt, ["0", "1", "2"], [0, 1, 1]), DECODE)
    assert verdict.reason == "reward_mismatch"
    assert verdict.refused
    assert verdict.rewards_G.tolist() == [0.0, 0.0, 0.0]
    assert "2 of 3 rewards differ (completion 1: claimed 1, the learner's 0)" in verdict.detail


def test_the_answer_a_sampler_sends_is_never_believed() -> None:
    task = make_task(AdditionTaskConfig(digits=2))
    prompt = a_training_prompt(task)
    forged = group(prompt, ["999", "999"], [1, 1], answer="999")  # consistent with its own (forged) answer
    assert recheck_rewards(task, forged, DECODE).reason == "reward_mismatch"


@pytest.mark.parametrize("prompt", ["1+2", "01+2=", "123+4=", "1-2=", "", "1+2=\n"])
def test_a_prompt_the_task_would_never_draw_is_unknown(prompt: str) -> None:
    task = make_task(AdditionTaskConfig(digits=2))
    assert recheck_rewards(task, group(prompt, ["3"], [1]), DECODE).reason == "unknown_prompt"


def test_held_out_prompts_are_not_training_prompts() -> None:
    for task in (make_task(AdditionTaskConfig(digits=2)), make_task(ReversalTaskConfig())):
        held_out = task.eval_set()[0]
        assert task.problem_for(held_out.prompt) is None
        train = next(task.train_stream(1))
        assert task.problem_for(train.prompt) == train


def test_math_prompts_come_from_the_learners_own_data(math_small: Path) -> None:
    task = make_task(MathTaskConfig(path=str(math_small), eval_size=4))
    problem = next(task.train_stream(0))
    assert task.problem_for(problem.prompt) == problem
    assert task.problem_for(task.eval_set()[0].prompt) is None
    assert task.problem_for("What is 2+2?") is None


def test_a_timeout_on_the_learner_is_not_held_against_the_sampler() -> None:
    class Slow(AdditionTask):
        def check(self, problem: Problem, completion: str) -> Check:
            if completion == "slow":
                return Check(0.0, timed_out=True)
            return super().check(problem, completion)

    task = Slow(AdditionTaskConfig(digits=2))
    prompt = a_training_prompt(task)
    verdict = recheck_rewards(task, group(prompt, ["slow", "0"], [1, 0]), DECODE)
    assert verdict.reason == ""
    assert verdict.rewards_G.tolist() == [0.0, 0.0]  # the learner trains on its own verdict


REWARDS = """
import random

def length(prompt, completion, answer, **info):
    return float(len(completion) == len(answer))

def judge(prompt, completion, answer, **info):
    return random.random()

judge.recomputable = False
"""


@pytest.fixture
def reward_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "heterorl_recheck_rewards.py").write_text(textwrap.dedent(REWARDS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "heterorl_recheck_rewards", raising=False)
    return "heterorl_recheck_rewards"


def test_custom_rewards_are_recomputed_unless_they_say_they_cannot_be(reward_module: str) -> None:
    task = make_task(AdditionTaskConfig(digits=2, reward=f"{reward_module}:length"))
    prompt = a_training_prompt(task)
    answer = task.problem_for(prompt).answer
    honest = group(prompt, ["9" * len(answer), "x" * (len(answer) + 1)], [1, 0])
    assert recheck_rewards(task, honest, DECODE).reason == ""
    assert recheck_rewards(task, group(prompt, ["x" * 9], [1]), DECODE).reason == "reward_mismatch"
    judged = make_task(AdditionTaskConfig(digits=2, reward=f"{reward_module}:judge"))
    verdict = recheck_rewards(judged, group(prompt, ["1"], [0.25]), DECODE)
    assert (verdict.reason, verdict.rewards_G, verdict.refused) == ("unverifiable", None, False)


@pytest.mark.parametrize("tolerance", [0.0, 1e-6, 0.1, 0.3])
def test_reward_comparison_is_the_float32_torch_one(tolerance: float) -> None:
    """`compare_rewards` (numpy) flags exactly what the float32 torch comparison flags, at the tolerance's edge too:
    float32(0.1) > 0.1, so a difference of exactly float32(0.1) is within a tolerance of 0.1."""
    from heterorl.tasks.recheck import compare_rewards

    gen = torch.Generator().manual_seed(3)
    claimed = torch.rand(64, generator=gen)
    edge = torch.tensor(tolerance, dtype=torch.float32)
    learner = torch.cat([claimed[:16] + edge, claimed[16:32] - edge, claimed[32:48], torch.rand(16, generator=gen)])
    learner = learner.float()
    timed_out = (torch.arange(64) % 5 == 0).tolist()
    want_off = ((learner - claimed).abs() > tolerance) & ~torch.tensor(timed_out)
    rewards, off = compare_rewards(learner.tolist(), timed_out, claimed.numpy(), tolerance)
    assert rewards.dtype == torch.float32
    assert torch.equal(rewards, learner)
    assert off.tolist() == want_off.tolist()
