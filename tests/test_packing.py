"""Shared-prompt packing (`learner.share_prompt`): the layout by hand, and the padded batch's log-probs, gradients
and learner step up to float rounding."""

from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from heterorl.learner import Learner
from heterorl.packing import pack_groups_shared, packed_token_logprobs
from heterorl.policy import Policy, SamplingParams
from heterorl.rollout import RolloutGroup, pack_groups
from heterorl.sampler import Sampler
from heterorl.tasks import make_task


def _group(gid: str, prompt: list[int], completions: list[list[int]]) -> RolloutGroup:
    L = max(len(c) for c in completions)
    ids = torch.tensor([c + [0] * (L - len(c)) for c in completions])
    mask = torch.tensor([[1] * len(c) + [0] * (L - len(c)) for c in completions])
    G = len(completions)
    return RolloutGroup(
        gid,
        "s",
        "p",
        "a",
        torch.tensor(prompt),
        ids,
        mask,
        torch.zeros(G, L),
        torch.zeros(G, L, dtype=torch.long),
        torch.zeros(G),
    )


def test_the_packed_layout_by_hand() -> None:
    batch = pack_groups([_group("a", [5, 6, 7], [[8, 1], [9, 9, 1]]), _group("b", [4], [[3], [2, 1]])], pad_id=0)
    packed = pack_groups_shared(batch)
    assert packed.input_ids_RT.tolist() == [[5, 6, 7, 8, 1, 9, 9, 1], [4, 3, 2, 1, 0, 0, 0, 0]]
    assert packed.position_ids_RT.tolist() == [[0, 1, 2, 3, 4, 3, 4, 5], [0, 1, 1, 2, 0, 0, 0, 0]]
    seen = packed.attention_R1TT[:, 0]
    assert seen[0, 6].tolist() == [True, True, True, False, False, True, True, False]  # 2nd completion's 2nd token
    assert seen[0, 4].tolist() == [True, True, True, True, True, False, False, False]  # 1st completion's last token
    assert seen[1, 5].tolist() == [True, False, False, False, False, True, False, False]  # padding: never an empty row
    T = packed.input_ids_RT.shape[1]
    # row b, token s is predicted by: the prompt's last column (s = 0), else the completion's previous column
    assert packed.source_BL.tolist() == [[2, 3, 0], [2, 5, 6], [T + 0, 0, 0], [T + 0, T + 2, 0]]


@pytest.fixture
def learner_and_groups(tiny_model_dir: Path):
    cfg = tiny_config(tiny_model_dir, "sampler.max_new_tokens=5", "task.digits=2")
    learner = Learner(Policy.load(tiny_model_dir), cfg)
    sampler = Sampler.from_policy("s", Policy.load(tiny_model_dir), make_task(cfg.task), learner.params, 4, seed=1)
    sampler.load_weights(0, learner.export_weights())
    groups = sampler.generate_groups(6)
    for g in groups:
        g.rewards_G = torch.tensor([1.0, 0.0, 0.0, 1.0])
    return cfg, learner, groups


def test_packed_logprobs_and_gradients_are_the_padded_ones(learner_and_groups) -> None:
    _, learner, groups = learner_and_groups
    batch = pack_groups(groups, learner.policy.pad_id)
    assert len({g.prompt_ids_P.numel() for g in groups}) > 1  # unequal prompts: left padding is really skipped
    policy, params = learner.policy, SamplingParams(temperature=0.9, top_k=20)
    padded = policy.token_logprobs(
        batch.prompt_ids_BP, batch.prompt_mask_BP, batch.completion_ids_BL, batch.completion_mask_BL, params
    )
    packed = packed_token_logprobs(policy, batch, params)
    torch.testing.assert_close(packed, padded, atol=2e-5, rtol=0)
    assert torch.equal(packed == 0, padded == 0)
    weights = list(policy.model.parameters())
    g_padded = torch.autograd.grad((padded * torch.linspace(-1, 1, padded.shape[1])).sum(), weights)
    g_packed = torch.autograd.grad((packed * torch.linspace(-1, 1, packed.shape[1])).sum(), weights)
    for a, b in zip(g_padded, g_packed, strict=True):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
    assert pack_groups_shared(batch).positions < batch.prompt_ids_BP.numel() + batch.completion_ids_BL.numel()


def test_a_learner_step_with_shared_prompts_is_the_padded_step(learner_and_groups, tiny_model_dir: Path) -> None:
    """The same loss, statistics and gradient norm (the first AdamW step is ~lr * sign(grad), so parameters whose
    gradient is ~0 may move either way under either rounding: the gradients are compared above)."""
    cfg, learner, groups = learner_and_groups
    shared_cfg = cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"share_prompt": True})})
    shared = Learner(Policy.load(tiny_model_dir), shared_cfg)
    padded_stats, shared_stats = learner.train_step(groups), shared.train_step(groups)
    assert shared_stats.keys() == padded_stats.keys()
    for key, value in padded_stats.items():
        assert shared_stats[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
