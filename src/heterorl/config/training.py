"""Sampler, learner, warm start, evaluation and metric sinks."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from heterorl.config.base import MAX_SEED, MAX_STEPS, Strict
from heterorl.config.engines import EngineConfig, TransformersEngineConfig


class FrictionConfig(Strict):
    """Delightful Distributed PG's frictions, injected by samplers for experiments (all off by default)."""

    actor_bug: float = Field(0.0, ge=0.0, le=1.0, description="Probability a completion becomes the landmine.")
    landmine: str = Field("zzzz", min_length=1, description="The fixed wrong completion an actor bug emits.")
    rare_discovery: float = Field(0.0, ge=0.0, le=1.0, description="Probability a completion becomes the answer.")
    reward_corruption: float = Field(
        0.0, ge=0.0, le=1.0, description="Probability a reward is replaced by a uniform draw from {0, 1}."
    )
    logit_noise: float = Field(0.0, ge=0.0, le=100.0, description="Std of Gaussian noise on the sampler's logits.")


class SamplerConfig(Strict):
    """How completions are drawn. Log-probs are always those of the distribution actually sampled from."""

    group_size: int = Field(8, ge=2, le=1024, description="G: completions per prompt.")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="Softmax temperature.")
    top_k: int = Field(0, ge=0, le=2**24, description="Keep the k most likely tokens; 0 disables.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass; 1 disables.")
    max_new_tokens: int = Field(16, ge=1, le=4096, description="Completion length limit.")
    interruptible: bool = Field(False, description="AReaL: weights arriving mid-generation apply to later tokens.")
    frictions: FrictionConfig = Field(default_factory=FrictionConfig, description="Injected actor faults.")
    engine: EngineConfig = Field(
        default_factory=TransformersEngineConfig, description="What generates: `transformers` or `vllm`."
    )


class LearnerConfig(Strict):
    """Optimizer and batch shape of the learner (fp32 master weights, AdamW)."""

    steps: int = Field(
        100, ge=1, le=MAX_STEPS, description="Learner steps (batches) to run; one weight version per step."
    )
    groups_per_step: int = Field(16, ge=1, le=1_000_000, description="Rollout groups (prompts) per learner step.")
    updates_per_batch: int = Field(
        1, ge=1, le=1_000_000, description="Optimizer steps per batch (minibatches of the batch)."
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO's dynamic sampling: a group whose rewards are all equal (no advantage, no gradient) is "
        "filtered at the learner and generated again, so every batch is informative.",
    )
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        le=2**32,
        description="Dynamic batching: accumulate over micro-batches of whole groups under this many tokens.",
    )
    share_prompt: bool = Field(
        False,
        description="Train each group's prompt once: its G completions packed after one copy of the prompt, each "
        "attending to the prompt and itself, with no padding (heterorl.packing). The same loss and gradient up to "
        "float rounding for ~(P + G*L) / (G*(P + L)) of the tokens; off by default because the rounding differs "
        "from the padded batch's, so a run is not bit-identical to one without it.",
    )
    autocast_bf16: bool = Field(False, description="Run the learner's forward pass under bf16 autocast (GPU).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    lr: float = Field(1e-4, gt=0.0, le=1.0, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, le=100.0, description="AdamW decoupled weight decay.")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1.")
    beta2: float = Field(0.99, ge=0.0, lt=1.0, description="AdamW beta2.")
    adam_eps: float = Field(1e-8, gt=0.0, le=1.0, description="AdamW epsilon.")
    grad_clip: float = Field(1.0, gt=0.0, le=1e9, description="Global gradient-norm clip.")
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS, description="Linear warm-up, in optimizer steps.")
    schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="Decay after warm-up.")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="Final lr / peak lr for cosine and linear.")
    min_behavior_logprob: float = Field(
        -104.0,
        ge=-1e4,
        le=0.0,
        description="Groups with a sampled token's log-prob below this are refused (bad_logprobs). Default: "
        "log(2^-150), below which a float32 probability is 0, so no sampler can have drawn the token.",
    )
    min_reward: float = Field(
        -1e4, ge=-1e30, le=1e30, description="Groups with a reward below this are refused (bad_rewards)."
    )
    max_reward: float = Field(
        1e4, ge=-1e30, le=1e30, description="Groups with a reward above this are refused (bad_rewards)."
    )
    max_skipped_steps: int = Field(
        10,
        ge=1,
        le=1_000_000,
        description="Stop with an error after this many steps in a row with a non-finite gradient (not applied).",
    )
    drop_poisoned_groups: bool = Field(
        True,
        description="A group whose own gradient is not finite is dropped from its step (charged to its sampler) and "
        "the rest trains; false: the whole step is skipped, as before (experiments measure the attack with it).",
    )

    @model_validator(mode="after")
    def _reward_range(self) -> LearnerConfig:
        if self.min_reward >= self.max_reward:
            raise ValueError(f"min_reward {self.min_reward} must be below max_reward {self.max_reward}")
        return self

    @model_validator(mode="after")
    def _minibatches(self) -> LearnerConfig:
        if self.groups_per_step % self.updates_per_batch:
            raise ValueError(
                f"groups_per_step {self.groups_per_step} must be divisible by updates_per_batch "
                f"{self.updates_per_batch}"
            )
        return self


class PretrainConfig(Strict):
    """Supervised warm start that yields a partly competent base model for RL."""

    max_steps: int = Field(2000, ge=1, le=MAX_STEPS, description="Upper bound on supervised steps.")
    batch_size: int = Field(64, ge=1, le=1_000_000, description="Examples per supervised step.")
    lr: float = Field(3e-3, gt=0.0, le=1.0, description="AdamW learning rate.")
    warmup_steps: int = Field(
        100, ge=0, le=MAX_STEPS, description="Linear learning-rate warm-up (stabilises the first steps)."
    )
    target_accuracy: float = Field(
        0.45,
        gt=0.0,
        le=1.0,
        description="Stop once held-out greedy accuracy reaches this (a partly competent base).",
    )
    eval_every: int = Field(25, ge=1, le=MAX_STEPS, description="Steps between accuracy checks.")
    eval_size: int = Field(128, ge=1, le=100_000, description="Held-out prompts for the accuracy checks.")
    seed: int | None = Field(
        None,
        ge=0,
        le=MAX_SEED,
        description="Seed of the warm start (initialisation and data); None: the run's seed. Fix it to share one "
        "base model across the seeds of a sweep, so that the seed varies only the RL run.",
    )


class EvalConfig(Strict):
    """Held-out evaluation: greedy accuracy always; with `samples` = k > 0 also pass@k and maj@k over completions
    sampled at the sampler's temperature / top-k / top-p (heterorl.evaluate)."""

    every: int = Field(20, ge=1, le=MAX_STEPS, description="Learner steps between held-out evaluations.")
    samples: int = Field(0, ge=0, le=1024, description="k of pass@k and maj@k (sampled completions); 0: greedy only.")
    samples_drawn: int | None = Field(
        None, ge=1, le=4096, description="n >= k completions drawn per prompt for the unbiased pass@k; default k."
    )

    @model_validator(mode="after")
    def _enough_samples(self) -> EvalConfig:
        if self.samples_drawn is not None and self.samples_drawn < self.samples:
            raise ValueError(f"samples_drawn {self.samples_drawn} must be >= samples {self.samples}")
        if self.samples_drawn is not None and self.samples == 0:
            raise ValueError("samples_drawn needs samples (k) > 0")
        return self

    @property
    def n_drawn(self) -> int:
        """Completions sampled per prompt (n)."""
        return self.samples_drawn or self.samples


class CheckpointConfig(Strict):
    """Model checkpoints during a run (transformers directories under <run_dir>/checkpoints/); the final weights
    always go to <run_dir>/checkpoint/."""

    every: int | None = Field(
        None, ge=1, le=MAX_STEPS, description="Write checkpoints/step-N every N learner steps; None: never."
    )
    keep_last: int = Field(2, ge=1, le=1_000_000, description="How many periodic checkpoints to keep (newest).")
    keep_best: bool = Field(
        True, description="Keep checkpoints/best: the weights of the best held-out accuracy so far (best.json says)."
    )


class MetricsConfig(Strict):
    """Metric sinks besides metrics.jsonl (always written), with the same keys."""

    tensorboard: bool = Field(False, description="Write TensorBoard event files to <run_dir>/tensorboard.")
    wandb: bool = Field(False, description="Log the run to Weights & Biases (files under <run_dir>/wandb).")
    wandb_mode: Literal["offline", "online"] = Field(
        "offline",
        description="offline: files only, `wandb sync` later; online: to the W&B server (needs a key and network).",
    )
    wandb_project: str = Field("heterorl", min_length=1, description="W&B project name.")


class RuntimeConfig(Strict):
    """How every process of the run computes; recorded in the run directory, so a run says how it was made."""

    threads: int | None = Field(
        1,
        ge=1,
        le=1024,
        description="torch intra-op threads per process. Fixed by default: float reductions split by thread, so "
        "results (and the cached warm start) would otherwise differ between machines; None = torch's default.",
    )
