"""DG's frictions, injected by the sampler: what they replace, how it is scored, and that they are seeded."""

from pathlib import Path

import torch

from heterorl.config import FrictionConfig, ReversalTaskConfig
from heterorl.policy import Policy, SamplingParams
from heterorl.sampler import Sampler
from heterorl.tasks import make_task


def _sampler(model_dir: Path, frictions: FrictionConfig, seed: int = 0, noise: float = 0.0) -> Sampler:
    policy = Policy.load(model_dir)
    task = make_task(ReversalTaskConfig(alphabet="ab", min_length=3, max_length=5))
    params = SamplingParams(max_new_tokens=6, logit_noise=noise)
    sampler = Sampler.from_policy("s", policy, task, params, group_size=4, seed=seed, frictions=frictions)
    sampler.load_weights(0, dict(policy.model.named_parameters()))
    return sampler


def _teacher_forced(sampler: Sampler, group) -> torch.Tensor:
    ids, mask = sampler.engine.policy.encode_prompts([group.prompt] * group.size)
    with torch.no_grad():
        return sampler.engine.policy.token_logprobs(
            ids, mask, group.completion_ids_GL, group.completion_mask_GL, SamplingParams(max_new_tokens=6)
        )


def test_actor_bugs_emit_the_landmine_scored_by_the_sampler_policy(tiny_model_dir: Path) -> None:
    sampler = _sampler(tiny_model_dir, FrictionConfig(actor_bug=1.0, landmine="zzz"))
    for g in sampler.generate_groups(3):
        texts = sampler.engine.policy.decode_completions(g.completion_ids_GL, g.completion_mask_GL)
        assert texts == ["zzz"] * 4
        assert (g.rewards_G == 0).all()
        assert torch.allclose(g.behavior_logp_GL, _teacher_forced(sampler, g), atol=1e-5)
    assert sampler.frictions.counts["actor_bug"] == 12


def test_rare_discovery_injects_the_correct_answer(tiny_model_dir: Path) -> None:
    sampler = _sampler(tiny_model_dir, FrictionConfig(rare_discovery=1.0))
    for g in sampler.generate_groups(3):
        texts = sampler.engine.policy.decode_completions(g.completion_ids_GL, g.completion_mask_GL)
        assert texts == [g.answer] * 4
        assert (g.rewards_G == 1).all()
        assert torch.allclose(g.behavior_logp_GL, _teacher_forced(sampler, g), atol=1e-5)


def test_partial_rates_replace_about_that_share(tiny_model_dir: Path) -> None:
    sampler = _sampler(tiny_model_dir, FrictionConfig(actor_bug=0.25))
    groups = sampler.generate_groups(50)
    landmines = sum(
        t == "zzzz"
        for g in groups
        for t in sampler.engine.policy.decode_completions(g.completion_ids_GL, g.completion_mask_GL)
    )
    assert 30 <= landmines <= 70  # 200 completions at p = 0.25 (expected 50, 4 sigma ~ 24)


def test_reward_corruption_is_a_fair_coin(tiny_model_dir: Path) -> None:
    sampler = _sampler(tiny_model_dir, FrictionConfig(rare_discovery=1.0, reward_corruption=1.0))
    rewards = torch.cat([g.rewards_G for g in sampler.generate_groups(50)])
    assert set(rewards.tolist()) <= {0.0, 1.0}
    assert 60 <= int(rewards.sum()) <= 140  # all answers correct, yet about half the rewards are 0


def test_logit_noise_changes_the_behaviour_policy(tiny_model_dir: Path) -> None:
    clean = _sampler(tiny_model_dir, FrictionConfig(), seed=3).generate_groups(4)
    noisy_sampler = _sampler(tiny_model_dir, FrictionConfig(), seed=3, noise=2.0)
    noisy = noisy_sampler.generate_groups(4)
    assert any(not torch.equal(a.completion_ids_GL, b.completion_ids_GL) for a, b in zip(clean, noisy, strict=True))
    gaps = [(_teacher_forced(noisy_sampler, g) - g.behavior_logp_GL).abs().max() for g in noisy]
    assert max(gaps) > 0.1  # the learner's view differs from the noisy actor's


def test_frictions_are_seeded(tiny_model_dir: Path) -> None:
    cfg = FrictionConfig(actor_bug=0.3, rare_discovery=0.3, reward_corruption=0.3)
    a = [g.rewards_G for g in _sampler(tiny_model_dir, cfg, seed=5).generate_groups(5)]
    b = [g.rewards_G for g in _sampler(tiny_model_dir, cfg, seed=5).generate_groups(5)]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
