"""Learner: turns rollout groups into optimizer steps on fp32 master weights and bumps the weight version.

One learner step = one batch of groups = one published weight version. A batch may be split into
`updates_per_batch` minibatches (one optimizer step each); the proximal log-probs (decoupled PPO, behaviour-weight
caps) are those of the weights at the start of the step, computed once per batch. With a KL penalty the learner
holds a frozen reference (the starting weights; with LoRA the base model with its adapters disabled) and runs one
no-grad forward pass of it per micro-batch. Truncated completions are found here (the objectives never see token
ids): DAPO's overlong penalty shapes their rewards before the advantages, `mask_truncated` drops them from the loss.

With several processes (heterorl.parallel.sharding) every rank runs this same step on its own whole groups; `shard` says
which micro-batches are this process's and how gradients and statistics meet, `train_policy` is what the forward
passes go through (the DDP wrapper or the FSDP2-sharded model), while `policy` stays the full model that rank 0
publishes, evaluates and checkpoints.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch

from heterorl.config import LearnerConfig, RunConfig
from heterorl.lora import adapter_state, apply_lora, enable_activation_checkpointing, merged_state
from heterorl.microbatch import StatsAccumulator, loss_share
from heterorl.objectives import group_advantages, objective_from_config
from heterorl.objectives.overlong import overlong_penalty, truncated_completions
from heterorl.packing import packed_token_logprobs
from heterorl.parallel.sharding import Sharding
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


def fused_or_foreach(params: list[torch.Tensor]) -> dict[str, bool]:
    """AdamW's implementation for `params`: fused on CPU and CUDA (torch has the kernel there), else the
    multi-tensor update (no Python loop over parameters)."""
    devices = {p.device.type for p in params}
    if devices and devices <= {"cpu", "cuda"}:
        return {"fused": True}
    return {"foreach": True}


class Learner:
    """Owns the master weights, the optimizer and the version counter."""

    def __init__(self, policy: Policy, cfg: RunConfig, reference: Policy | None = None) -> None:
        """`reference`: the frozen model of the KL penalty (`objective.ref_kl_beta`); by default the weights the
        learner starts from (a resumed learner must pass the run's base model)."""
        self.policy = policy
        self.cfg = cfg.learner
        self.objective = objective_from_config(cfg.objective)
        self.options = cfg.objective
        self.params = SamplingParams.from_config(cfg.sampler)
        self.max_new_tokens = cfg.sampler.max_new_tokens
        if self.options.overlong_cache > self.max_new_tokens:
            raise ValueError(
                f"objective.overlong_cache {self.options.overlong_cache} exceeds sampler.max_new_tokens "
                f"{self.max_new_tokens}"
            )
        policy.model = policy.model.float()
        self.reference = self._make_reference(reference, lora=cfg.model.lora is not None)
        if cfg.model.lora is not None:
            policy.model = apply_lora(policy.model, cfg.model.lora)
        self.lora = cfg.model.lora
        model = policy.model
        model.train()
        if self.cfg.gradient_checkpointing:
            enable_activation_checkpointing(model)
        self.shard = Sharding()
        self.train_policy = policy  # what forward passes go through
        self.train_module = model  # the module whose parameters train (with LoRA, the PEFT model)
        self.build_optimizer()
        self.version = 0
        self.wire_dtype = WIRE_DTYPES[cfg.weights.wire_dtype]

    def build_optimizer(self) -> None:
        """AdamW and the LR schedule over `train_module`'s trainable parameters (again after FSDP2 replaced them)."""
        self.trainable = [p for p in self.train_module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.trainable,
            lr=self.cfg.lr,
            betas=(self.cfg.beta1, self.cfg.beta2),
            eps=self.cfg.adam_eps,
            weight_decay=self.cfg.weight_decay,
            # the fused kernel: one pass over each parameter and its moments instead of a dozen elementwise passes
            # (the per-tensor and multi-tensor updates on CPU); 6.5x faster than foreach at 146M parameters on one
            # core, what TRL's default (`adamw_torch_fused`) runs. Its floats agree with the per-tensor update's to
            # rounding (tests/test_learner.py), not bit for bit.
            **fused_or_foreach(self.trainable),
        )
        total = self.cfg.steps * self.cfg.updates_per_batch
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_multiplier(s, total, self.cfg))

    def _make_reference(self, given: Policy | None, lora: bool) -> Policy | None:
        """The frozen reference of the KL penalty: None when the penalty is off or (LoRA) when the base model is the
        policy with its adapters disabled (PEFT's `disable_adapter`, no second copy); else `given` or an fp32 copy
        of the starting weights."""
        if not self.objective.needs_ref_logp or (given is None and lora):
            return None
        policy = self.policy
        ref = given or Policy(copy.deepcopy(policy.model), policy.tokenizer, policy.device, policy.chat_template)
        ref.model = ref.model.float().eval().requires_grad_(False)
        return ref

    # ------------------------------------------------------------------ training
    def _logp(self, batch: Batch, policy: Policy | None = None) -> torch.Tensor:
        policy = policy or self.train_policy
        device_type = policy.device.type
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=self.cfg.autocast_bf16):
            if self.cfg.share_prompt:
                return packed_token_logprobs(policy, batch, self.params).float()
            logp = policy.token_logprobs(
                batch.prompt_ids_BP,
                batch.prompt_mask_BP,
                batch.completion_ids_BL,
                batch.completion_mask_BL,
                self.params,
            )
        return logp.float()

    @torch.no_grad()
    def _ref_logp(self, batch: Batch) -> torch.Tensor:
        """Log-probs under the frozen reference (same autocast as the policy, so they agree at the start)."""
        if self.reference is not None:
            return self._logp(batch, self.reference)
        with self.train_module.disable_adapter():
            return self._logp(batch)

    def _rewards_and_loss_mask(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """Rewards after DAPO's overlong penalty (reward shaping, before advantages), the loss mask [B, L] without
        the truncated completions when `mask_truncated`, and their statistics."""
        truncated_B = truncated_completions(batch.completion_ids_BL, batch.completion_mask_BL, self.policy.eos_id)
        rewards_B = batch.rewards_B
        stats = {"obj/truncated_frac": float(truncated_B.float().mean())}
        if self.options.overlong_cache > 0:
            length_B = batch.completion_mask_BL.sum(dim=1)
            penalty_B = overlong_penalty(
                length_B, self.max_new_tokens, self.options.overlong_cache, self.options.overlong_penalty_factor
            ).to(rewards_B.dtype)
            rewards_B = rewards_B + penalty_B
            stats["obj/overlong_penalty_mean"] = float(penalty_B.mean())
        loss_mask_BL = batch.completion_mask_BL.bool()
        if self.options.mask_truncated:
            loss_mask_BL = loss_mask_BL & ~truncated_B[:, None]
        return rewards_B, loss_mask_BL, stats

    def train_step(self, groups: list[RolloutGroup]) -> dict[str, float]:
        """advantages -> objective -> optimizer step(s) -> version + 1. Returns namespaced statistics.

        The batch is split into `updates_per_batch` minibatches (one optimizer step each), each minibatch into
        micro-batches under `micro_batch_tokens` whose gradients accumulate exactly (heterorl.microbatch); with
        several processes, into this process's micro-batches of the global minibatch (heterorl.parallel.sharding).
        An optimizer step whose gradient norm is not finite is never applied: one inf or NaN would otherwise spread
        to every weight and to every sampler. In one process the step first looks for the groups that poison it
        -- those whose own gradient (each group's backward alone) is not finite, e.g. one token with an extreme
        behaviour log-prob -- drops them (`dropped`, for the loop to charge their samplers) and trains the rest of
        the minibatch exactly as if they had not been in it. When no group is finite alone (the learner's own
        weights may be at fault) nothing is dropped. A step that is still not finite is skipped
        (`opt/skipped_updates`); with several processes every rank skips the same steps (the norm is global).
        """
        shard = self.shard
        groups = shard.begin_step(groups)
        self.dropped: list[RolloutGroup] = []
        batch = pack_groups(groups, self.policy.pad_id).to(self.policy.device)
        rewards_B, loss_mask_BL, shaping_stats = self._rewards_and_loss_mask(batch)
        adv_B = group_advantages(rewards_B, batch.group_index_B, normalize=self.objective.normalize_advantages)
        prox_logp_BL = self._prox_logp(batch, loss_mask_BL) if self.objective.needs_prox_logp else None
        step_inputs = (batch, loss_mask_BL, adv_B, prox_logp_BL)
        acc = StatsAccumulator()
        skipped = 0  # optimizer steps whose gradient norm was not finite
        chunks = torch.arange(len(groups)).chunk(self.cfg.updates_per_batch)
        for chunk in chunks:
            grad_norm, parts = self._minibatch(chunk, *step_inputs)
            if not math.isfinite(grad_norm) and shard.world == 1 and self.cfg.drop_poisoned_groups:
                poison = [int(g) for g in chunk if not math.isfinite(self._minibatch(g.view(1), *step_inputs)[0])]
                kept = torch.tensor([int(g) for g in chunk if int(g) not in poison], dtype=torch.long)
                if poison and len(kept):  # when no group is finite alone, the fault may be the learner's own
                    self.dropped += [groups[g] for g in poison]
                    grad_norm, parts = self._minibatch(kept, *step_inputs)
            for stats, share in parts:
                acc.add(stats, weight=share / len(chunks))
            acc.add({"opt/lr": self.scheduler.get_last_lr()[0], "opt/grad_norm": grad_norm}, 1 / len(chunks))
            if not math.isfinite(grad_norm):  # never apply inf/NaN: weights and AdamW's moments stay as they are
                skipped += 1
                continue
            self.optimizer.step()
            self.scheduler.step()
        shard.end_step()
        acc = shard.reduce_stats(acc)
        self.version += 1
        stats = {**acc.result(), **shaping_stats, "opt/skipped_updates": float(skipped)}
        stats["learner/poisoned_groups"] = float(len(self.dropped))
        rewards = batch.rewards_B.float()  # the verifier's rewards, before any shaping
        stats.update(
            {
                "reward/mean": float(rewards.mean()),
                "reward/std": float(rewards.std()) if rewards.numel() > 1 else 0.0,
                "perf/groups": float(len(groups)),
                "perf/tokens": float(batch.num_tokens),
                "perf/completion_len": batch.num_tokens / rewards.numel(),
                "perf/prompt_len": float(batch.prompt_mask_BP.sum()) / rewards.numel(),
            }
        )
        return stats

    def _minibatch(
        self,
        chunk: torch.Tensor,
        batch: Batch,
        loss_mask_BL: torch.Tensor,
        adv_B: torch.Tensor,
        prox_logp_BL: torch.Tensor | None,
    ) -> tuple[float, list[tuple[dict[str, float], float]]]:
        """The gradient of the minibatch of groups `chunk`, accumulated over its micro-batches and clipped when
        finite; returns its pre-clip norm and each micro-batch's (statistics, share of the minibatch)."""
        shard = self.shard
        rows_B = torch.isin(batch.group_index_B, chunk.to(batch.group_index_B.device)).nonzero().squeeze(-1)
        self.optimizer.zero_grad(set_to_none=True)
        parts = []
        for micro in shard.micro_batches(batch, rows_B, self.cfg.micro_batch_tokens, loss_mask_BL):
            with shard.accumulating(micro.last):
                if not micro.live:
                    self._stand_in(batch.select(micro.rows_B, trim=True))
                    continue
                share = loss_share(self.objective.aggregation, loss_mask_BL, micro.rows_B, rows_B)
                stats = self._micro_backward(batch, micro.rows_B, share, loss_mask_BL, adv_B, prox_logp_BL)
            parts.append((stats, share))
        return shard.clip_grad_norm(self.trainable, self.cfg.grad_clip), parts

    @torch.no_grad()
    def _prox_logp(self, batch: Batch, loss_mask_BL: torch.Tensor) -> torch.Tensor:
        """Log-probs [B, L] of the weights at the start of the step, for the rows this process trains on."""
        rows = self.shard.local_rows(batch, loss_mask_BL)
        if rows is None:
            return self._logp(batch)
        prox_logp_BL = torch.zeros_like(batch.behavior_logp_BL)
        prox_logp_BL[rows] = self._logp(batch.select(rows))
        return prox_logp_BL

    def _micro_backward(
        self,
        batch: Batch,
        rows_B: torch.Tensor,
        share: float,
        loss_mask_BL: torch.Tensor,
        adv_B: torch.Tensor,
        prox_logp_BL: torch.Tensor | None,
    ) -> dict[str, float]:
        """One micro-batch's loss, scaled by its share of the minibatch normaliser, backward; its statistics."""
        micro = batch.select(rows_B, trim=self.objective.aggregation != "dr_grpo")
        out = self.objective(
            logp=self._logp(micro),
            behavior_logp=micro.behavior_logp_BL,
            mask=loss_mask_BL[rows_B, : micro.width],
            advantages=adv_B[rows_B],
            group_index=micro.group_index_B,
            prox_logp=None if prox_logp_BL is None else prox_logp_BL[rows_B, : micro.width],
            ref_logp=self._ref_logp(micro) if self.objective.needs_ref_logp else None,
        )
        (out.loss * (share * self.shard.grad_scale)).backward()
        return {f"obj/{k}": v for k, v in out.stats.items()}

    def _stand_in(self, micro: Batch) -> None:
        """The forward passes of a micro-batch and a backward of exactly zero: keeps a rank with less work in step
        with the others' collectives (heterorl.parallel.sharding). Non-finite log-probs are zeroed so 0 * inf
        cannot leak."""
        if self.objective.needs_ref_logp:
            self._ref_logp(micro)
        logp = self._logp(micro)
        (torch.where(torch.isfinite(logp), logp, 0.0).sum() * 0.0).backward()

    def optimizer_state_dict(self) -> dict:
        """AdamW's full state in the single-process layout, whatever the sharding (durable states store it)."""
        return self.shard.optimizer_state(self.optimizer)

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
