from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from heterorl.config import LearnerConfig
from heterorl.learner import Learner, fused_or_foreach, lr_multiplier
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


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_reference_kl_starts_at_zero_and_the_reference_stays_frozen(tiny_model_dir: Path) -> None:
    _, learner, sampler = _setup(tiny_model_dir, "objective.ref_kl_beta=0.1")
    assert learner.reference is not None
    start = _params(learner.reference.model)
    first = learner.train_step(_groups_with_signal(sampler, 4))
    assert first["obj/kl_ref"] == 0.0  # the reference is the starting weights, computed the same way
    second = learner.train_step(_groups_with_signal(sampler, 4))
    assert second["obj/kl_ref"] > 0
    assert all(torch.equal(v, start[k]) for k, v in learner.reference.model.named_parameters())
    assert not any(p.requires_grad for p in learner.reference.model.parameters())
    assert not any(torch.equal(p, start[k]) for k, p in learner.policy.model.named_parameters() if "weight" in k)


def test_reference_kl_across_optimizer_steps_of_one_batch(tiny_model_dir: Path) -> None:
    _, learner, sampler = _setup(tiny_model_dir, "objective.ref_kl_beta=0.1", "learner.updates_per_batch=2")
    stats = learner.train_step(_groups_with_signal(sampler, 4))
    assert stats["obj/kl_ref"] > 0  # the second minibatch sees the weights after the first update


def test_reference_kl_with_lora_disables_the_adapters(tiny_model_dir: Path) -> None:
    _, learner, sampler = _setup(
        tiny_model_dir,
        "objective.ref_kl_beta=0.1",
        "model.lora={rank: 4, target_modules: [q_proj, v_proj], publish: merged}",
    )
    assert learner.reference is None  # no second copy: the base model is the policy without its adapters
    assert learner.train_step(_groups_with_signal(sampler, 4))["obj/kl_ref"] == 0.0
    assert learner.train_step(_groups_with_signal(sampler, 4))["obj/kl_ref"] > 0


def test_no_reference_without_the_penalty(tiny_model_dir: Path) -> None:
    _, learner, sampler = _setup(tiny_model_dir)
    assert learner.reference is None
    assert "obj/kl_ref" not in learner.train_step(_groups_with_signal(sampler, 4))


def _with_eos_in(groups, rows: set[int], eos_id: int):
    """End the completions of `rows` (index within each group) with eos; strip eos from every other row."""
    for g in groups:
        for i in range(g.size):
            n = int(g.completion_mask_GL[i].sum())
            ids = g.completion_ids_GL[i, :n]
            ids[ids == eos_id] = eos_id + 1
            if i in rows:
                ids[n - 1] = eos_id
    return groups


def test_mask_truncated_hides_truncated_completions_from_the_objective(tiny_model_dir: Path) -> None:
    _, learner, sampler = _setup(tiny_model_dir, "objective.mask_truncated=true")
    groups = _with_eos_in(_groups_with_signal(sampler, 2), {0, 3}, learner.policy.eos_id)
    masks = []
    objective = learner.objective

    def recording(**kwargs):
        masks.append(kwargs["mask"].clone())
        return objective(**kwargs)

    learner.objective = recording  # type: ignore[assignment]
    learner.objective.normalize_advantages = objective.normalize_advantages  # type: ignore[attr-defined]
    learner.objective.aggregation = objective.aggregation  # type: ignore[attr-defined]
    learner.objective.needs_prox_logp = False  # type: ignore[attr-defined]
    learner.objective.needs_ref_logp = False  # type: ignore[attr-defined]
    stats = learner.train_step(groups)
    (mask,) = masks
    kept = [g.completion_mask_GL.bool() & torch.tensor([[True], [False], [False], [True]]) for g in groups]
    width = mask.shape[1]
    assert torch.equal(mask, torch.cat([k[:, :width] for k in kept]))
    assert stats["obj/truncated_frac"] == 0.5


def test_a_batch_of_truncated_completions_trains_nothing(tiny_model_dir: Path) -> None:
    _, learner, sampler = _setup(tiny_model_dir, "objective.mask_truncated=true", "learner.micro_batch_tokens=30")
    groups = _with_eos_in(_groups_with_signal(sampler, 4), set(), learner.policy.eos_id)
    before = _params(learner.policy.model)
    stats = learner.train_step(groups)
    assert stats["obj/truncated_frac"] == 1.0
    assert all(torch.equal(p, before[k]) for k, p in learner.policy.model.named_parameters())
    assert learner.version == 1


def test_overlong_penalty_shapes_rewards_before_advantages(tiny_model_dir: Path) -> None:
    # equal rewards carry no signal; the penalty on the longer completions does (max_new_tokens 3, cache 2:
    # lengths 1, 2, 3 get 0, -1/2, -1)
    _, learner, sampler = _setup(tiny_model_dir, "objective.overlong_cache=2", "learner.weight_decay=0.0")
    groups = sampler.generate_groups(4)
    for g in groups:
        g.rewards_G = torch.ones(4)
    lengths = torch.cat([g.completion_mask_GL.sum(1) for g in groups]).float()
    expected = torch.where(lengths <= 1, 0.0, (1 - lengths) / 2).mean()
    before = _params(learner.policy.model)
    stats = learner.train_step(groups)
    assert stats["obj/overlong_penalty_mean"] == pytest.approx(float(expected))
    assert stats["reward/mean"] == 1.0  # the verifier's reward, unshaped
    assert any(not torch.equal(p, before[k]) for k, p in learner.policy.model.named_parameters())
    assert stats["obj/overlong_penalty_mean"] < 0


def test_overlong_cache_longer_than_the_generation_limit_is_rejected(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=r"overlong_cache 4 exceeds sampler\.max_new_tokens 3"):
        _setup(tiny_model_dir, "objective.overlong_cache=4")


@pytest.mark.parametrize(
    "overrides",
    [
        ["objective.name=grpo", "objective.cap_mode=clamp"],
        ["objective.name=gspo", "objective.cap_mode=mask", "objective.cap_level=geometric"],
        ["objective.name=cispo"],
    ],
)
def test_capped_and_new_objectives_train(tiny_model_dir: Path, overrides: list[str]) -> None:
    _, learner, sampler = _setup(tiny_model_dir, *overrides)
    before = _params(learner.policy.model)
    stats = learner.train_step(_groups_with_signal(sampler, 4))
    assert any(not torch.equal(p, before[k]) for k, p in learner.policy.model.named_parameters())
    if "objective.name=cispo" not in overrides:
        assert "obj/cap_frac" in stats  # the proximal forward pass ran


def test_the_fused_adamw_gives_the_per_tensor_update(tiny_model_dir: Path) -> None:
    """The learner's AdamW runs the fused kernel on CPU: its steps, weight decay and LR schedule included, are the
    default per-tensor AdamW's to float rounding (a few ulp of each parameter after three steps)."""
    overrides = ("learner.weight_decay=0.1", "learner.lr=1e-3", "learner.warmup_steps=2")
    _, learner, sampler = _setup(tiny_model_dir, *overrides)
    assert learner.optimizer.defaults["fused"] is True
    reference = [p.detach().clone().requires_grad_(True) for p in learner.trainable]
    start = [p.detach().clone() for p in learner.trainable]
    group = learner.optimizer.param_groups[0]
    per_tensor = torch.optim.AdamW(
        reference, lr=group["lr"], betas=group["betas"], eps=group["eps"], weight_decay=group["weight_decay"]
    )
    assert per_tensor.defaults["foreach"] is None  # the default: per tensor on CPU
    for _ in range(3):
        per_tensor.param_groups[0]["lr"] = learner.optimizer.param_groups[0]["lr"]  # the schedule's for this step
        learner.train_step(_groups_with_signal(sampler, 2))
        for p, q in zip(learner.trainable, reference, strict=True):
            q.grad = p.grad.clone()
        per_tensor.step()
        for p, q in zip(learner.trainable, reference, strict=True):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-8)
    moved = max(float((p.detach() - q0).abs().max()) for p, q0 in zip(learner.trainable, start, strict=True))
    assert moved > 1e-3  # three real steps, far above the tolerance


def test_adamw_is_fused_on_cpu_and_cuda_and_multi_tensor_elsewhere() -> None:
    assert fused_or_foreach([torch.zeros(2), torch.zeros(3)]) == {"fused": True}
    assert fused_or_foreach([torch.zeros(2, device="meta")]) == {"foreach": True}
    assert fused_or_foreach([torch.zeros(2), torch.zeros(2, device="meta")]) == {"foreach": True}
