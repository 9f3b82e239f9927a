"""Learner: turns rollout groups into optimizer steps on fp32 master weights and bumps the weight version.

One learner step = one batch of groups = one published weight version. A batch may be split into
`updates_per_batch` minibatches (one optimizer step each); the proximal log-probs of decoupled PPO are those of
the weights at the start of the step, computed once per batch.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from heterorl.config import LearnerConfig, RunConfig
from heterorl.lora import adapter_state, apply_lora, enable_activation_checkpointing, merged_state
from heterorl.microbatch import StatsAccumulator, loss_share, split_by_tokens
from heterorl.objectives import group_advantages, objective_from_config
from heterorl.policy import Policy, SamplingParams
from heterorl.rollout import Batch, RolloutGroup, pack_groups

WIRE_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def lr_multiplier(step: int, total: int, cfg: LearnerConfig) -> float:
    """Linear warm-up to the peak, then constant, cosine or linear decay to `min_lr_ratio` at `total`."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    decay = 0.5 * (1.0 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1.0 - progress
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * decay


class Learner:
    """Owns the master weights, the optimizer and the version counter."""

    def __init__(self, policy: Policy, cfg: RunConfig) -> None:
        self.policy = policy
        self.cfg = cfg.learner
        self.objective = objective_from_config(cfg.objective)
        self.params = SamplingParams.from_config(cfg.sampler)
        policy.model = policy.model.float()
        if cfg.model.lora is not None:
            policy.model = apply_lora(policy.model, cfg.model.lora)
        self.lora = cfg.model.lora
        model = policy.model
        model.train()
        if self.cfg.gradient_checkpointing:
            enable_activation_checkpointing(model)
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.trainable,
            lr=self.cfg.lr,
            betas=(self.cfg.beta1, self.cfg.beta2),
            eps=self.cfg.adam_eps,
            weight_decay=self.cfg.weight_decay,
        )
        total = self.cfg.steps * self.cfg.updates_per_batch
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_multiplier(s, total, self.cfg))
        self.version = 0
        self.wire_dtype = WIRE_DTYPES[cfg.weights.wire_dtype]

    # ------------------------------------------------------------------ training
    def _logp(self, batch: Batch) -> torch.Tensor:
        device_type = self.policy.device.type
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.cfg.autocast_bf16):
            logp = self.policy.token_logprobs(
                batch.prompt_ids_BP,
                batch.prompt_mask_BP,
                batch.completion_ids_BL,
                batch.completion_mask_BL,
                self.params,
            )
        return logp.float()

    def train_step(self, groups: list[RolloutGroup]) -> dict[str, float]:
        """advantages -> objective -> optimizer step(s) -> version + 1. Returns namespaced statistics.

        The batch is split into `updates_per_batch` minibatches (one optimizer step each), each minibatch into
        micro-batches under `micro_batch_tokens` whose gradients accumulate exactly (heterorl.microbatch).
        """
        batch = pack_groups(groups, self.policy.pad_id).to(self.policy.device)
        adv_B = group_advantages(batch.rewards_B, batch.group_index_B, normalize=self.objective.normalize_advantages)
        prox_logp_BL = None
        if self.objective.needs_prox_logp:
            with torch.no_grad():
                prox_logp_BL = self._logp(batch)
        aggregation = getattr(self.objective.config, "aggregation", "seq_mean")
        acc = StatsAccumulator()
        chunks = torch.arange(len(groups)).chunk(self.cfg.updates_per_batch)
        for chunk in chunks:
            rows_B = torch.isin(batch.group_index_B, chunk.to(batch.group_index_B.device)).nonzero().squeeze(-1)
            self.optimizer.zero_grad(set_to_none=True)
            for micro_rows in split_by_tokens(batch, rows_B, self.cfg.micro_batch_tokens):
                share = loss_share(aggregation, batch, micro_rows, rows_B)
                micro = batch.select(micro_rows, trim=aggregation != "dr_grpo")
                out = self.objective(
                    logp=self._logp(micro),
                    behavior_logp=micro.behavior_logp_BL,
                    mask=micro.completion_mask_BL,
                    advantages=adv_B[micro_rows],
                    group_index=micro.group_index_B,
                    prox_logp=None if prox_logp_BL is None else prox_logp_BL[micro_rows, : micro.width],
                )
                (out.loss * share).backward()
                acc.add({f"obj/{k}": v for k, v in out.stats.items()}, weight=share / len(chunks))
            grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable, self.cfg.grad_clip)
            acc.add({"opt/lr": self.scheduler.get_last_lr()[0], "opt/grad_norm": float(grad_norm)}, 1 / len(chunks))
            self.optimizer.step()
            self.scheduler.step()
        self.version += 1
        stats = acc.result()
        rewards = batch.rewards_B.float()
        stats.update(
            {
                "reward/mean": float(rewards.mean()),
                "reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
                "perf/groups": float(len(groups)),
                "perf/tokens": float(batch.num_tokens),
                "perf/completion_len": batch.num_tokens / rewards.numel(),
            }
        )
        return stats

    # ------------------------------------------------------------------ weights out
    def _published_state(self) -> dict[str, torch.Tensor]:
        model = self.policy.model
        if self.lora is None:
            return dict(model.named_parameters())
        return adapter_state(model) if self.lora.publish == "adapter" else merged_state(model)

    def export_weights(self) -> dict[str, torch.Tensor]:
        """What samplers receive, cast to the wire dtype (a fresh copy): every parameter, or with LoRA the adapter
        tensors alone or the merged weights (`model.lora.publish`)."""
        return {
            name: p.detach().to(device="cpu", dtype=self.wire_dtype, copy=True)
            for name, p in self._published_state().items()
        }

    def save_checkpoint(self, path: str | Path) -> None:
        """A transformers checkpoint (safetensors + tokenizer + config) of the fp32 master weights; with LoRA the
        merged weights, and the adapter itself in `adapter/` (PEFT format)."""
        model = self.policy.model
        if self.lora is None:
            self.policy.save(path)
            return
        merged = {name: t.detach().clone() for name, t in merged_state(model).items()}
        model.get_base_model().save_pretrained(path, state_dict=merged, safe_serialization=True)
        self.policy.tokenizer.save_pretrained(path)
        model.save_pretrained(Path(path) / "adapter")
