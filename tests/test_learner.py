from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from heterorl.config import LearnerConfig
from heterorl.learner import Learner, lr_multiplier
from heterorl.policy import Policy, SamplingParams
from heterorl.sampler import Sampler
from heterorl.tasks import make_task


def _setup(model_dir: Path, *overrides: str):
    cfg = tiny_config(model_dir, *overrides)
    learner = Learner(Policy.load(model_dir), cfg)
    sampler = Sampler.from_policy(
        "s", Policy.load(model_dir), make_task(cfg.task), SamplingParams.from_config(cfg.sampler), 4, 0
    )
    sampler.load_weights(0, learner.export_weights())
    return cfg, learner, sampler


def _groups_with_signal(sampler: Sampler, n: int):
    """Groups whose rewards are not all equal (so advantages, and gradients, are non-zero)."""
    groups = sampler.generate_groups(n)
    for g in groups:
        g.rewards_G = torch.tensor([1.0, 0.0, 0.0, 1.0])
    return groups


def test_train_step_updates_weights_and_version(tiny_model_dir: Path) -> None:
    _, learner, sampler = _setup(tiny_model_dir)
    before = {k: v.clone() for k, v in learner.policy.model.state_dict().items()}
    stats = learner.train_step(_groups_with_signal(sampler, 4))
    assert learner.version == 1
    changed = [k for k, v in learner.policy.model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed
    for key in ("obj/loss", "obj/kl_k3", "obj/is_weight_var", "obj/clip_frac", "opt/grad_norm", "reward/mean"):
        assert key in stats


def test_equal_rewards_leave_weights_unchanged(tiny_model_dir: Path) -> None:
    _, learner, sampler = _setup(tiny_model_dir, "learner.weight_decay=0.0")
    groups = sampler.generate_groups(4)
    for g in groups:
        g.rewards_G = torch.ones(4)
    before = {k: v.clone() for k, v in learner.policy.model.state_dict().items()}
    learner.train_step(groups)
    assert all(torch.equal(v, before[k]) for k, v in learner.policy.model.state_dict().items())


def test_updates_per_batch_makes_several_optimizer_steps(tiny_model_dir: Path) -> None:
    _, learner, sampler = _setup(tiny_model_dir, "learner.updates_per_batch=2")
    learner.train_step(_groups_with_signal(sampler, 4))
    steps = {int(s["step"]) for s in learner.optimizer.state.values()}
    assert steps == {2}
    assert learner.version == 1


def test_decoupled_ppo_gets_proximal_logprobs(tiny_model_dir: Path) -> None:
    _, learner, sampler = _setup(tiny_model_dir, "objective.name=decoupled_ppo", "learner.updates_per_batch=2")
    stats = learner.train_step(_groups_with_signal(sampler, 4))
    assert "obj/cap_frac" in stats


def test_export_is_the_bf16_view_of_the_fp32_master(tiny_model_dir: Path) -> None:
    _, learner, _ = _setup(tiny_model_dir)
    exported = learner.export_weights()
    for name, p in learner.policy.model.named_parameters():
        assert p.dtype == torch.float32
        assert exported[name].dtype == torch.bfloat16
        assert torch.equal(exported[name], p.detach().to(torch.bfloat16))
        assert exported[name].data_ptr() != p.data_ptr()


def test_sampler_loads_exactly_the_published_bits(tiny_model_dir: Path) -> None:
    _, learner, sampler = _setup(tiny_model_dir)
    for name, p in sampler.engine.policy.model.named_parameters():
        assert torch.equal(p.detach(), learner.export_weights()[name].float())


@pytest.mark.parametrize(
    ("schedule", "step", "expected"),
    [("constant", 50, 1.0), ("cosine", 10, 1.0), ("cosine", 60, 0.55), ("cosine", 110, 0.1), ("linear", 60, 0.55)],
)
def test_lr_schedule(schedule: str, step: int, expected: float) -> None:
    cfg = LearnerConfig(warmup_steps=10, schedule=schedule, min_lr_ratio=0.1)
    assert lr_multiplier(step, 110, cfg) == pytest.approx(expected)
    assert lr_multiplier(0, 110, cfg) == pytest.approx(0.1)  # warm-up starts at 1/warmup
