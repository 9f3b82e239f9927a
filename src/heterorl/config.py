"""Run configuration: one pydantic model per component, composed into `RunConfig`.

This module must not import torch (the CLI parses configs before loading heavy modules). Every field has a
description and bounds; unknown keys are rejected; cross-field rules live in validators. Choices between
implementations (objective, task, delay model) are discriminated unions keyed by `name` / `kind`, so an
unknown name fails when the config is parsed, with a message naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the offending field."""


class Strict(BaseModel):
    """Base for all config sections: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --- model
class LoraConfig(Strict):
    """LoRA adapters (PEFT) trained by the learner instead of the full weights."""

    rank: int = Field(8, ge=1, le=1024, description="Adapter rank r.")
    alpha: float = Field(16.0, gt=0.0, description="Scale numerator: the update is (alpha / r) * B @ A.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the adapter input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="Module names that get adapters.",
    )
    publish: Literal["adapter", "merged"] = Field(
        "adapter", description="Send only the adapter tensors, or the merged full weights, to samplers."
    )


class ModelConfig(Strict):
    """The policy network: a local transformers checkpoint, or a small architecture built in code."""

    path: str | None = Field(None, description="Local transformers checkpoint directory; None builds `arch`.")
    arch: Literal["qwen3", "llama"] = Field("qwen3", description="Architecture family when building in code.")
    hidden_size: int = Field(128, ge=8, le=8192, description="Width of the residual stream.")
    num_layers: int = Field(2, ge=1, le=128, description="Number of transformer blocks.")
    num_heads: int = Field(4, ge=1, le=128, description="Attention heads.")
    num_kv_heads: int = Field(2, ge=1, le=128, description="Key/value heads (grouped-query attention).")
    intermediate_size: int = Field(256, ge=8, description="MLP hidden width.")
    max_positions: int = Field(64, ge=8, description="Maximum sequence length (prompt + completion).")
    device: Literal["auto", "cpu", "cuda"] = Field("cpu", description="Where to run; auto picks CUDA if present.")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Samplers' compute dtype; the learner always keeps fp32 master weights."
    )
    lora: LoraConfig | None = Field(None, description="Train LoRA adapters instead of every weight.")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must be divisible by num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} must be divisible by num_kv_heads {self.num_kv_heads}")
        return self


# --- tasks
REWARD_HELP = (
    "Custom reward 'module:function' replacing the task's verifier as training reward; called as "
    "f(prompt, completion, answer, **info) -> float. None uses the verifier."
)
REWARD_PATTERN = r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$"  # module.path:function
MATH_PROMPT_TEMPLATE = "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{}."


class _TaskBase(Strict):
    eval_size: int = Field(256, ge=1, le=100_000, description="Held-out prompts for greedy evaluation.")
    chat_template: bool = Field(False, description="Wrap each prompt as a user turn with the tokenizer's template.")
    reward: str | None = Field(None, pattern=REWARD_PATTERN, description=REWARD_HELP)


class AdditionTaskConfig(_TaskBase):
    """`a+b=` -> the decimal sum; a and b have up to `digits` digits."""

    name: Literal["addition"] = "addition"
    digits: int = Field(2, ge=1, le=12, description="Maximum number of digits of each operand.")


class ReversalTaskConfig(_TaskBase):
    """`s=` -> s reversed, s a string over `alphabet` (the Delightful PG papers' task)."""

    name: Literal["reversal"] = "reversal"
    min_length: int = Field(4, ge=1, le=48, description="Shortest string to reverse.")
    max_length: int = Field(8, ge=1, le=48, description="Longest string to reverse.")
    alphabet: str = Field("abcd", min_length=2, max_length=26, description="Symbols (lower-case letters).")

    @model_validator(mode="after")
    def _lengths(self) -> ReversalTaskConfig:
        if self.min_length > self.max_length:
            raise ValueError(f"min_length {self.min_length} > max_length {self.max_length}")
        if not (self.alphabet.isalpha() and self.alphabet.islower() and len(set(self.alphabet)) == len(self.alphabet)):
            raise ValueError("alphabet must be distinct lower-case letters")
        return self


class MathTaskConfig(_TaskBase):
    """Problems with reference answers from a JSONL or parquet file; reward 1 when math-verify finds them equal."""

    name: Literal["math"] = "math"
    path: str = Field(..., min_length=1, description="JSONL or parquet file of problems.")
    eval_path: str | None = Field(
        None, description="Separate file of held-out problems (its prompts are removed from training)."
    )
    eval_fraction: float = Field(
        0.1, gt=0.0, lt=1.0, description="Share of `path` held out, chosen by prompt hash; unused with eval_path."
    )
    problem_field: str = Field("problem", min_length=1, description="Record field holding the problem text.")
    answer_field: str = Field("answer", min_length=1, description="Record field holding the reference answer.")
    prompt_template: str = Field(
        MATH_PROMPT_TEMPLATE, description="Prompt text; `{problem}` is replaced, other braces are literal."
    )
    timeout_s: float = Field(
        5.0, gt=0.0, le=600.0, description="Bound on one check (parse + compare); a check over it scores 0."
    )

    @model_validator(mode="after")
    def _template(self) -> MathTaskConfig:
        if "{problem}" not in self.prompt_template:
            raise ValueError("prompt_template must contain {problem}")
        return self


class GymTaskConfig(_TaskBase):
    """A procedural reasoning-gym dataset, rewarded by the dataset's own `score_answer`."""

    name: Literal["gym"] = "gym"
    dataset: str = Field(..., min_length=1, description="reasoning-gym dataset, e.g. basic_arithmetic, chain_sum.")
    dataset_options: dict[str, Any] = Field(
        default_factory=dict, description="Options of that dataset's config (e.g. min_terms, max_terms)."
    )
    size: int = Field(1000, ge=2, le=10_000_000, description="Entries generated (training + held-out).")
    seed: int = Field(0, ge=0, description="Seed of the generated entries (fixed data, not the run seed).")
    eval_fraction: float = Field(0.1, gt=0.0, lt=1.0, description="Share of entries held out, by prompt hash.")
    prompt_template: str = Field("{question}", description="Prompt text; `{question}` is replaced by the question.")
    answer_tag: str | None = Field(
        None,
        pattern=r"^\w+$",
        description="Score the text inside the last <tag>...</tag> (none: reward 0); None scores the whole "
        "completion, stripped.",
    )

    @model_validator(mode="after")
    def _template_and_options(self) -> GymTaskConfig:
        if "{question}" not in self.prompt_template:
            raise ValueError("prompt_template must contain {question}")
        clash = {"seed", "size"} & set(self.dataset_options)
        if clash:
            raise ValueError(f"dataset_options must not set {sorted(clash)}; use task.seed / task.size")
        return self


TaskConfig = Annotated[
    AdditionTaskConfig | ReversalTaskConfig | MathTaskConfig | GymTaskConfig, Field(discriminator="name")
]


# --- objectives
Aggregation = Literal["seq_mean_token_mean", "token_mean", "dr_grpo"]
AGGREGATION_HELP = (
    "seq_mean_token_mean: mean over tokens of each sequence, then over sequences (every sequence counts the same); "
    "token_mean: mean over all tokens of the batch (long sequences count more); "
    "dr_grpo: sum over tokens / (B * max_len) (no length normalisation, Dr.GRPO)."
)


class GRPOConfig(Strict):
    """GRPO: token-level ratio against the behaviour log-probs, PPO clip (DAPO clip-higher when eps_high > eps_low)."""

    name: Literal["grpo"] = "grpo"
    eps_low: float = Field(0.2, ge=0.0, le=1.0, description="Lower clip range: ratio >= 1 - eps_low.")
    eps_high: float = Field(0.2, ge=0.0, description="Upper clip range: ratio <= 1 + eps_high.")
    aggregation: Aggregation = Field("seq_mean_token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(True, description="Divide group-centred advantages by the group std.")


class GSPOConfig(Strict):
    """GSPO: sequence-level, length-normalised ratio with a very narrow clip range."""

    name: Literal["gspo"] = "gspo"
    eps_low: float = Field(3e-4, ge=0.0, le=1.0, description="Lower clip range of the sequence ratio.")
    eps_high: float = Field(4e-4, ge=0.0, description="Upper clip range of the sequence ratio.")
    normalize_advantages: bool = Field(True, description="Divide group-centred advantages by the group std.")


class GEPOConfig(Strict):
    """GEPO: sequence weight p_i / E_q[q] with the group expectation shared by the G completions of a prompt."""

    name: Literal["gepo"] = "gepo"
    eps: float = Field(0.2, ge=0.0, le=1.0, description="Clip range of the group-expectation weight.")
    defensive_lam: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Defensive mixture: denominator (1-lam) E_q[q] + lam sg(p_i); 1 -> plain PG.",
    )
    switch: bool = Field(False, description="gepo+: use q_i as denominator for sequences whose KL < switch_kappa.")
    switch_kappa: float = Field(0.002, ge=0.0, description="KL threshold of the gepo+ switch.")
    kl_beta: float = Field(0.0, ge=0.0, description="Weight of the learner–sampler KL penalty (paper: 0.005).")
    normalize_advantages: bool = Field(False, description="GEPO centres advantages without dividing by the std.")


class DGConfig(Strict):
    """Delightful PG: gate each token by sigmoid((A * surprisal - lam) / eta); no behaviour log-probs."""

    name: Literal["dg"] = "dg"
    eta: float = Field(1.0, ge=0.0, description="Gate temperature; 0 gives the hard gate 1[chi > lam].")
    lam: float = Field(0.0, description="Gate threshold on delight chi = A * surprisal.")
    aggregation: Aggregation = Field("seq_mean_token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(False, description="DG uses reward minus the group mean.")


class DecoupledPPOConfig(Strict):
    """AReaL's decoupled PPO: clip against the proximal policy, behaviour importance weight capped."""

    name: Literal["decoupled_ppo"] = "decoupled_ppo"
    eps: float = Field(0.2, ge=0.0, le=1.0, description="Lower clip range (and upper unless eps_high is set).")
    eps_high: float | None = Field(None, ge=0.0, description="Upper clip range; None uses eps.")
    cap: float = Field(5.0, gt=0.0, description="Behaviour importance weight cap.")
    cap_mode: Literal["mask", "clamp"] = Field("mask", description="mask: drop tokens above cap; clamp: truncate.")
    aggregation: Aggregation = Field("token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(True, description="Divide group-centred advantages by the group std.")


class PGConfig(Strict):
    """REINFORCE with the group-mean baseline and no off-policy correction."""

    name: Literal["pg"] = "pg"
    aggregation: Aggregation = Field("seq_mean_token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(False, description="Divide group-centred advantages by the group std.")


class ISPGConfig(Strict):
    """Importance-weighted PG with the exact sequence ratio, truncated."""

    name: Literal["is_pg"] = "is_pg"
    truncate: float = Field(10.0, gt=0.0, description="Upper bound of the sequence importance weight.")
    aggregation: Aggregation = Field("seq_mean_token_mean", description=AGGREGATION_HELP)
    normalize_advantages: bool = Field(False, description="Divide group-centred advantages by the group std.")


ObjectiveConfig = Annotated[
    GRPOConfig | GSPOConfig | GEPOConfig | DGConfig | DecoupledPPOConfig | PGConfig | ISPGConfig,
    Field(discriminator="name"),
]
OBJECTIVE_CONFIGS: dict[str, type[Strict]] = {
    c.model_fields["name"].default: c
    for c in (GRPOConfig, GSPOConfig, GEPOConfig, DGConfig, DecoupledPPOConfig, PGConfig, ISPGConfig)
}


# --- sampler / learner
class FrictionConfig(Strict):
    """Delightful Distributed PG's frictions, injected by samplers for experiments (all off by default)."""

    actor_bug: float = Field(0.0, ge=0.0, le=1.0, description="Probability a completion becomes the landmine.")
    landmine: str = Field("zzzz", min_length=1, description="The fixed wrong completion an actor bug emits.")
    rare_discovery: float = Field(0.0, ge=0.0, le=1.0, description="Probability a completion becomes the answer.")
    reward_corruption: float = Field(
        0.0, ge=0.0, le=1.0, description="Probability a reward is replaced by a uniform draw from {0, 1}."
    )
    logit_noise: float = Field(0.0, ge=0.0, description="Std of Gaussian noise on the sampler's logits.")


class SamplerConfig(Strict):
    """How completions are drawn. Log-probs are always those of the distribution actually sampled from."""

    group_size: int = Field(8, ge=2, le=1024, description="G: completions per prompt.")
    temperature: float = Field(1.0, gt=0.0, le=10.0, description="Softmax temperature.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens; 0 disables.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass; 1 disables.")
    max_new_tokens: int = Field(16, ge=1, le=4096, description="Completion length limit.")
    interruptible: bool = Field(False, description="AReaL: weights arriving mid-generation apply to later tokens.")
    frictions: FrictionConfig = Field(default_factory=FrictionConfig, description="Injected actor faults.")


class LearnerConfig(Strict):
    """Optimizer and batch shape of the learner (fp32 master weights, AdamW)."""

    steps: int = Field(100, ge=1, description="Learner steps (batches) to run; one weight version per step.")
    groups_per_step: int = Field(16, ge=1, description="Rollout groups (prompts) per learner step.")
    updates_per_batch: int = Field(1, ge=1, description="Optimizer steps per batch (minibatches of the batch).")
    micro_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="Dynamic batching: accumulate over micro-batches of whole groups under this many tokens.",
    )
    autocast_bf16: bool = Field(False, description="Run the learner's forward pass under bf16 autocast (GPU).")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward to save memory.")
    lr: float = Field(1e-4, gt=0.0, le=1.0, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW decoupled weight decay.")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="AdamW beta1.")
    beta2: float = Field(0.99, ge=0.0, lt=1.0, description="AdamW beta2.")
    adam_eps: float = Field(1e-8, gt=0.0, description="AdamW epsilon.")
    grad_clip: float = Field(1.0, gt=0.0, description="Global gradient-norm clip.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up, in optimizer steps.")
    schedule: Literal["constant", "cosine", "linear"] = Field("constant", description="Decay after warm-up.")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="Final lr / peak lr for cosine and linear.")

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

    max_steps: int = Field(2000, ge=1, description="Upper bound on supervised steps.")
    batch_size: int = Field(64, ge=1, description="Examples per supervised step.")
    lr: float = Field(3e-3, gt=0.0, description="AdamW learning rate.")
    warmup_steps: int = Field(100, ge=0, description="Linear learning-rate warm-up (stabilises the first steps).")
    target_accuracy: float = Field(
        0.45,
        gt=0.0,
        le=1.0,
        description="Stop once held-out greedy accuracy reaches this (a partly competent base).",
    )
    eval_every: int = Field(25, ge=1, description="Steps between accuracy checks.")
    eval_size: int = Field(128, ge=1, description="Held-out prompts for the accuracy checks.")


class EvalConfig(Strict):
    every: int = Field(20, ge=1, description="Learner steps between held-out greedy evaluations.")


class MetricsConfig(Strict):
    """Metric sinks besides metrics.jsonl (always written), filled from it when the run ends."""

    tensorboard: bool = Field(False, description="Write TensorBoard event files to <run_dir>/tensorboard.")
    wandb: bool = Field(False, description="Log an offline W&B run under <run_dir>/wandb (`wandb sync` later).")
    wandb_project: str = Field("heterorl", min_length=1, description="W&B project name.")


# --- network
class FixedDelay(Strict):
    kind: Literal["fixed"] = "fixed"
    seconds: float = Field(0.0, ge=0.0, description="Constant delay.")


class UniformDelay(Strict):
    kind: Literal["uniform"] = "uniform"
    low: float = Field(..., ge=0.0, description="Smallest delay (s).")
    high: float = Field(..., ge=0.0, description="Largest delay (s).")

    @model_validator(mode="after")
    def _order(self) -> UniformDelay:
        if self.low > self.high:
            raise ValueError(f"low {self.low} > high {self.high}")
        return self


class ExponentialDelay(Strict):
    kind: Literal["exponential"] = "exponential"
    mean: float = Field(..., gt=0.0, description="Mean of the exponential part (s).")
    offset: float = Field(0.0, ge=0.0, description="Added constant (s).")


class _BandDelay(Strict):
    """A distribution fitted so that [lower, upper] holds `conf` of its mass; samples are shifted and clipped."""

    lower: float = Field(60.0, gt=0.0, description="Lower end of the confidence band and clip floor (s).")
    upper: float = Field(1920.0, gt=0.0, description="Upper end of the confidence band and clip ceiling (s).")
    conf: float = Field(0.995, gt=0.0, lt=1.0, description="Probability mass inside [lower, upper].")
    offset: float = Field(0.0, ge=0.0, description="Subtracted from each sample before clipping (s).")

    @model_validator(mode="after")
    def _order(self) -> _BandDelay:
        if self.lower >= self.upper:
            raise ValueError(f"lower {self.lower} must be < upper {self.upper}")
        return self


class LogNormalDelay(_BandDelay):
    kind: Literal["lognormal"] = "lognormal"


class WeibullDelay(_BandDelay):
    kind: Literal["weibull"] = "weibull"


DelayConfig = Annotated[
    FixedDelay | UniformDelay | ExponentialDelay | LogNormalDelay | WeibullDelay, Field(discriminator="kind")
]


class FaultConfig(Strict):
    """Fault injection on one path of a link (probabilities per message)."""

    drop: float = Field(0.0, ge=0.0, le=1.0, description="Message lost.")
    duplicate: float = Field(0.0, ge=0.0, le=1.0, description="Message delivered twice.")
    reorder: float = Field(0.0, ge=0.0, le=1.0, description="Message held back by `reorder_seconds`.")
    reorder_seconds: float = Field(30.0, ge=0.0, description="Extra delay of a reordered message.")
    corrupt: float = Field(0.0, ge=0.0, le=1.0, description="One byte of the payload flipped.")


class LinkConfig(Strict):
    """A sampler's link to the learner: transfer time = delay + bytes / bandwidth."""

    weights_delay: DelayConfig = Field(default_factory=FixedDelay, description="Learner -> sampler delay model.")
    rollout_delay: DelayConfig = Field(default_factory=FixedDelay, description="Sampler -> learner delay model.")
    bandwidth_mbps: float | None = Field(None, gt=0.0, description="Megabits per second; None = unlimited.")
    weights_faults: FaultConfig = Field(default_factory=FaultConfig, description="Faults on the weights path.")
    rollout_faults: FaultConfig = Field(default_factory=FaultConfig, description="Faults on the rollout path.")


class SamplerNodeConfig(Strict):
    """One sampler machine of the cluster."""

    name: str | None = Field(None, description="Identifier; defaults to sampler-<index>.")
    tokens_per_second: float = Field(2000.0, gt=0.0, description="Generation speed (virtual time).")
    link: LinkConfig = Field(default_factory=LinkConfig, description="Its link to the learner.")


class ClusterConfig(Strict):
    """Who runs where, at which speed, and how staleness is controlled."""

    mode: Literal["sync", "async"] = Field("sync", description="sync: samplers always hold the newest weights.")
    samplers: list[SamplerNodeConfig] = Field(
        default_factory=lambda: [SamplerNodeConfig()], min_length=1, description="Sampler nodes."
    )
    learner_step_seconds: float = Field(1.0, ge=0.0, description="Virtual cost of one learner step (s).")
    learner_seconds_per_token: float = Field(0.0, ge=0.0, description="Extra virtual cost per trained token (s).")
    max_staleness: int | None = Field(None, ge=0, description="HeteroRL window: drop groups older than this.")
    eta: int | None = Field(None, ge=0, description="AReaL admission bound on versions ahead; 0 = synchronous.")


# --- weights
class WeightsConfig(Strict):
    """How weights travel from the learner to samplers."""

    codec: Literal["full", "pulse"] = Field("pulse", description="full state dicts or PULSE sparse patches.")
    wire_dtype: Literal["bfloat16", "float16", "float32"] = Field("bfloat16", description="Samplers' weight dtype.")
    snapshot_every: int = Field(10, ge=1, description="Publish a full snapshot every K versions.")
    max_chain: int = Field(16, ge=1, description="Longest patch chain served before a snapshot is preferred.")
    retain: int = Field(64, ge=1, description="Versions kept in the store.")
    zstd_level: int = Field(1, ge=-7, le=22, description="zstd level of patch payloads.")
    overlap: bool = Field(True, description="Publish in a worker thread while the next learner step runs.")


# --- live cluster
class LiveConfig(Strict):
    """The live cluster: the learner's HTTP service, the sampler clients, durability and the local launcher.

    Only `heterorl learner`, `heterorl sampler` and `heterorl run --live` read this section; the simulated
    cluster ignores it. Defaults suit a learner and samplers on one host or a LAN; see docs/deployment.md.
    """

    token_env: str = Field(
        "HETERORL_TOKEN", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Environment variable with the token."
    )
    token_file: str | None = Field(
        None, min_length=1, description="File holding the bearer token; read before `token_env` when set."
    )
    max_body_bytes: int = Field(
        16 * 2**20, ge=1024, le=2**31, description="Largest rollout POST body the learner reads; larger -> 413."
    )
    max_queued_groups: int = Field(
        4096, ge=1, le=10_000_000, description="Groups waiting for the learner before POSTs get 503 (backpressure)."
    )
    poll_seconds: float = Field(
        5.0, ge=0.0, le=300.0, description="Longest long-poll of GET /v1/weights when the sampler is current."
    )
    connected_seconds: float = Field(
        30.0, gt=0.0, le=86_400.0, description="A sampler heard from within this many seconds counts as connected."
    )
    checkpoint_every: int = Field(
        10, ge=1, le=1_000_000, description="Learner steps between durable learner-state checkpoints."
    )
    fsync: bool = Field(True, description="fsync every journaled group before acknowledging it (power-loss safety).")
    emulate_links: bool = Field(
        False, description="Samplers apply their node's link delays, bandwidth and faults for real (experiments)."
    )
    request_timeout_s: float = Field(
        120.0, gt=0.0, le=3600.0, description="Sampler: timeout of one request (a long-poll adds poll_seconds)."
    )
    backoff_initial_s: float = Field(0.2, gt=0.0, le=60.0, description="Sampler: first delay before a retry.")
    backoff_max_s: float = Field(
        10.0, gt=0.0, le=3600.0, description="Sampler: cap of the retry delay (doubles per failure, with jitter)."
    )
    patience_s: float = Field(
        600.0, gt=0.0, le=604_800.0, description="Sampler: give up after this long without reaching the learner."
    )
    linger_s: float = Field(
        5.0, ge=0.0, le=600.0, description="Learner: keep answering this long after the last step (samplers see it)."
    )
    startup_timeout_s: float = Field(
        600.0, gt=0.0, le=86_400.0, description="run --live: longest wait for the learner to start listening."
    )

    @model_validator(mode="after")
    def _backoff_order(self) -> LiveConfig:
        if self.backoff_initial_s > self.backoff_max_s:
            raise ValueError(f"backoff_initial_s {self.backoff_initial_s} > backoff_max_s {self.backoff_max_s}")
        return self


# --- run
class RunConfig(Strict):
    """Everything a run needs; written, resolved, into the run directory."""

    seed: int = Field(0, ge=0, description="Seed of every random stream in the run.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=AdditionTaskConfig)
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    objective: ObjectiveConfig = Field(default_factory=GRPOConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)
    live: LiveConfig = Field(default_factory=LiveConfig)

    @model_validator(mode="after")
    def _eta_needs_async(self) -> RunConfig:
        if self.cluster.mode == "sync" and (self.cluster.eta or self.cluster.max_staleness):
            raise ValueError("cluster.eta / cluster.max_staleness only apply to cluster.mode 'async'")
        return self


# --- loading
def _format_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        lines.append(f"  {loc}: {e['msg']}")
    return "invalid config:\n" + "\n".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a","b","c"], value); the value is parsed as YAML (numbers, bools, lists, null)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like dotted.key=value")
    key, raw = item.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from exc
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted overrides to a raw config dict; list items are addressed by index (`cluster.samplers.0.x`)."""
    for item in overrides:
        path, value = parse_override(item)
        node: Any = data
        for i, part in enumerate(path[:-1]):
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"override {item!r}: {'.'.join(path[: i + 1])} is not a valid list index")
                node = node[int(part)]
            else:
                node = node.setdefault(part, {})
            if not isinstance(node, dict | list):
                raise ConfigError(f"override {item!r}: {'.'.join(path[: i + 1])} is not a section")
        last = path[-1]
        if isinstance(node, list):
            if not last.isdigit() or int(last) >= len(node):
                raise ConfigError(f"override {item!r}: {last!r} is not a valid list index")
            node[int(last)] = value
        else:
            node[last] = value
    return data


def read_yaml_mapping(path: str | Path, error: type[ValueError] = ConfigError) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (an empty file gives {}); `error` names the file and the problem."""
    p = Path(path)
    if not p.is_file():
        raise error(f"file not found: {p}")
    try:
        loaded = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise error(f"{p}: not valid YAML ({exc})") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise error(f"{p}: the top level must be a mapping")
    return loaded or {}


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML config (or the defaults), apply `--set` overrides, validate; errors name the field."""
    data: dict[str, Any] = {}
    if path is not None:
        loaded = read_yaml_mapping(path)
        # a JSON round trip gives every YAML alias (&anchor / *ref) its own copy, so an override of one
        # list item never silently changes the items that shared the anchor
        data = json.loads(json.dumps(loaded))
    data = apply_overrides(data, overrides or [])
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc)) from None


def config_to_yaml(cfg: BaseModel) -> str:
    """The resolved config as YAML (round-trips through `load_config`)."""
    return yaml.safe_dump(json.loads(cfg.model_dump_json()), sort_keys=False)
