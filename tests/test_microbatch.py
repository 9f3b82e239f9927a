"""Dynamic batching: micro-batches of whole groups under a token budget accumulate the full-batch gradient."""

from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from heterorl.learner import Learner
from heterorl.microbatch import StatsAccumulator, split_by_tokens
from heterorl.policy import Policy, SamplingParams
from heterorl.rollout import pack_groups
from heterorl.sampler import Sampler
from heterorl.tasks import make_task


def _groups(model_dir: Path, cfg, n: int = 6):
    sampler = Sampler.from_policy(
        "s", Policy.load(model_dir), make_task(cfg.task), SamplingParams(max_new_tokens=5), 4, seed=1
    )
    sampler.load_weights(0, dict(Policy.load(model_dir).model.named_parameters()))
    groups = sampler.generate_groups(n)
    for i, g in enumerate(groups):
        g.rewards_G = torch.tensor([1.0, 0.0, float(i % 2), 0.5])
        g.behavior_logp_GL = g.behavior_logp_GL - 0.05 * g.completion_mask_GL  # a stale sampler
    return groups


def _gradient(model_dir: Path, groups, *overrides: str) -> torch.Tensor:
    cfg = tiny_config(model_dir, "sampler.max_new_tokens=5", *overrides)
    learner = Learner(Policy.load(model_dir), cfg)
    if cfg.objective.ref_kl_beta > 0:  # move the policy off its reference, or the KL term has no gradient
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in learner.trainable:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    captured = {}

    def capture(optimizer, args, kwargs):
        captured["g"] = torch.cat([p.grad.flatten() for p in learner.trainable])

    learner.optimizer.register_step_pre_hook(capture)
    learner.train_step(groups)
    return captured["g"]


@pytest.mark.parametrize(
    "objective",
    [
        ["objective.name=grpo"],
        ["objective.name=grpo", "objective.aggregation=token_mean"],
        ["objective.name=grpo", "objective.aggregation=dr_grpo"],
        ["objective.name=gspo"],
        ["objective.name=gepo", "objective.kl_beta=0.005"],
        ["objective.name=dg"],
        ["objective.name=decoupled_ppo"],
        # behaviour-weight caps (the sampler here is 0.05 nats per token off), dual clip, CISPO
        ["objective.name=grpo", "objective.cap_mode=clamp", "objective.cap=1.03"],
        [
            "objective.name=grpo",
            "objective.aggregation=token_mean",
            "objective.cap_mode=mask",
            "objective.cap=1.2",
            "objective.cap_level=sequence",
        ],
        ["objective.name=grpo", "objective.dual_clip=1.03"],
        ["objective.name=gspo", "objective.cap_mode=clamp", "objective.cap=1.03"],
        ["objective.name=gepo", "objective.cap_mode=mask", "objective.cap_level=sequence", "objective.cap=1.2"],
        [
            "objective.name=decoupled_ppo",
            "objective.cap_mode=clamp",
            "objective.cap_level=geometric",
            "objective.cap=1.03",
            "objective.dual_clip=1.5",
        ],
        ["objective.name=cispo"],
        [
            "objective.name=cispo",
            "objective.aggregation=seq_mean_token_mean",
            "objective.eps_high=0.02",
            "objective.cap_mode=clamp",
            "objective.cap=1.03",
        ],
        # KL to the reference (one extra forward pass per micro-batch), also across several optimizer steps
        ["objective.name=grpo", "objective.aggregation=token_mean", "objective.ref_kl_beta=0.5"],
        ["objective.name=gepo", "objective.ref_kl_beta=0.5", "objective.ref_kl_estimator=k2"],
        [
            "objective.name=dg",
            "objective.aggregation=dr_grpo",
            "objective.ref_kl_beta=0.5",
            "objective.ref_kl_estimator=k1",
        ],
        ["objective.name=decoupled_ppo", "objective.ref_kl_beta=0.5", "learner.updates_per_batch=2"],
        # truncated completions: masked from the loss, penalised in the rewards
        [
            "objective.name=grpo",
            "objective.aggregation=token_mean",
            "objective.mask_truncated=true",
            "objective.overlong_cache=3",
        ],
        ["objective.name=gspo", "objective.eps_low=0.2", "objective.mask_truncated=true"],
        [
            "objective.name=grpo",
            "objective.aggregation=dr_grpo",
            "objective.mask_truncated=true",
            "objective.overlong_cache=5",
            "objective.overlong_penalty_factor=0.5",
        ],
    ],
    ids=lambda o: "-".join(x.split("=")[1] for x in o),
)
def test_micro_batches_accumulate_the_full_batch_gradient(tiny_model_dir: Path, objective: list[str]) -> None:
    cfg = tiny_config(tiny_model_dir, "learner.groups_per_step=6")
    groups = _groups(tiny_model_dir, cfg)
    full = _gradient(tiny_model_dir, groups, "learner.groups_per_step=6", *objective)
    micro = _gradient(tiny_model_dir, groups, "learner.groups_per_step=6", "learner.micro_batch_tokens=40", *objective)
    assert full.abs().max() > 0
    assert torch.allclose(micro, full, atol=1e-6, rtol=1e-4)


def test_split_keeps_groups_whole_and_respects_the_budget(tiny_model_dir: Path) -> None:
    cfg = tiny_config(tiny_model_dir)
    batch = pack_groups(_groups(tiny_model_dir, cfg), pad_id=0)
    rows = torch.arange(batch.group_index_B.shape[0])
    tokens_B = batch.prompt_mask_BP.sum(1) + batch.completion_mask_BL.sum(1)
    parts = split_by_tokens(batch, rows, budget=40)
    assert len(parts) > 1
    assert sorted(torch.cat(parts).tolist()) == rows.tolist()
    for part in parts:
        groups = batch.group_index_B[part].unique()
        whole = torch.isin(batch.group_index_B, groups).nonzero().squeeze(-1)
        assert sorted(part.tolist()) == whole.tolist()  # every group entirely inside one micro-batch
        assert int(tokens_B[part].sum()) <= 40 or len(groups) == 1
    assert split_by_tokens(batch, rows, budget=None)[0] is rows


def test_stats_accumulator_weights_means_and_keeps_maxima() -> None:
    acc = StatsAccumulator()
    acc.add({"loss": 1.0, "is_weight_max": 3.0}, weight=0.25)
    acc.add({"loss": 3.0, "is_weight_max": 2.0}, weight=0.75)
    assert acc.result() == {"loss": 2.5, "is_weight_max": 3.0}
