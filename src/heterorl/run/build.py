"""The one place that builds a run's components from its config: torch's threads, the base model, the task, the
learner, each sampler (policy, engine, dtype, chat template, LoRA wrapping, frictions, seeds) and its receiver.

Every driver calls these — the simulated cluster, the live learner process, every live sampler process — so a
setting cannot mean one thing under one clock and another under the other.
"""

from __future__ import annotations

import importlib
import tempfile
from pathlib import Path
from typing import Any

import torch

from heterorl.adversaries import Adversary
from heterorl.config import RunConfig
from heterorl.engines.base import EngineError, RolloutEngine
from heterorl.errors import PathNotFoundError
from heterorl.learner import Learner
from heterorl.lora import apply_lora
from heterorl.policy import Policy, SamplingParams, TextFormat, load_tokenizer, resolve_device
from heterorl.pretrain import ensure_base_model
from heterorl.sampler import Sampler
from heterorl.tasks import Task, make_task


def configure_torch(cfg: RunConfig) -> None:
    """Apply `runtime.threads` to this process (results depend on the thread count) and seed torch."""
    if cfg.runtime.threads is not None:
        torch.set_num_threads(cfg.runtime.threads)
    torch.manual_seed(cfg.seed)


def check_sinks(cfg: RunConfig) -> None:
    """Fail before any work when an asked-for metric sink cannot work (W&B online without a key or a server)."""
    if cfg.metrics.wandb:
        from heterorl.sinks import wandb_preflight

        wandb_preflight(cfg.metrics.wandb_mode)


def check_traces(cfg: RunConfig) -> None:
    """Read every link trace the config names, so that a missing or malformed one (`TraceError`, one line) stops
    the run before the warm start is built and before the run directory is written."""
    from heterorl.network.trace import read_trace

    for node in cfg.cluster.samplers:
        if node.link.trace is not None:
            read_trace(node.link.trace)


def sampler_seed(seed: int, index: int) -> int:
    """Independent, reproducible stream per sampler (prompts and sampling)."""
    return seed * 1_000_003 + 7919 * (index + 1)


def checked_model_path(cfg: RunConfig) -> str | None:
    """`model.path` when set, after checking that it is a transformers checkpoint on this host."""
    path = cfg.model.path
    if path is not None and not (Path(path).expanduser() / "config.json").is_file():
        raise PathNotFoundError(f"model.path {path!r} is not a transformers checkpoint (no config.json)")
    return path


def resolve_base_model(cfg: RunConfig, show_progress: bool = True) -> tuple[str, dict[str, Any]]:
    """`model.path`, or the cached warm start built from the config (and how it was built)."""
    path = checked_model_path(cfg)
    if path is not None:
        return path, {}
    result = ensure_base_model(cfg, show_progress=show_progress)
    info = {"steps": result.steps, "val_accuracy": result.val_accuracy, "state_hash": result.state_hash}
    return result.path, {**info, "threads": result.threads}


def build_task(cfg: RunConfig) -> Task:
    return make_task(cfg.task)


def build_learner(cfg: RunConfig, base: str) -> Learner:
    """The learner: fp32 master weights of the base model (with fresh LoRA adapters when configured)."""
    device = resolve_device(cfg.model.device)
    return Learner(Policy.load(base, device, chat_template=cfg.task.chat_template), cfg)


def sampler_policy(cfg: RunConfig, base: str | None) -> Policy:
    """A sampler's model in `model.dtype`: the base checkpoint, or (base None, model built in code) the
    architecture alone — its weights arrive from the learner as a snapshot before it generates anything.

    With LoRA adapters published alone the sampler must hold the learner's exact base weights, so it wraps the
    base checkpoint with the same adapter config; the learner's adapter tensors then arrive under PEFT names.
    """
    device = resolve_device(cfg.model.device)
    dtype = getattr(torch, cfg.model.dtype)
    adapters = cfg.model.lora is not None and cfg.model.lora.publish == "adapter"
    if base is None and (adapters or cfg.model.path is not None):
        base = checked_model_path(cfg) or resolve_base_model(cfg, show_progress=False)[0]
    if base is None:
        built = Policy.from_config(cfg.model, seed=cfg.seed)
        policy = Policy(built.model.to(dtype), built.tokenizer, device, cfg.task.chat_template)
    else:
        policy = Policy.load(base, device, dtype, chat_template=cfg.task.chat_template)
    if adapters:
        assert cfg.model.lora is not None
        policy.model = apply_lora(policy.model, cfg.model.lora)
    return policy


def _checkpoint_dir(cfg: RunConfig, base: str | None) -> str:
    """A checkpoint directory for engines that load one (vLLM): the base model, `model.path`, the warm start when
    LoRA adapters travel alone (their base must be exact), else the architecture saved once to a temporary
    directory (its weights are replaced by the learner's first snapshot)."""
    if base is not None:
        return base
    if cfg.model.path is not None or (cfg.model.lora is not None and cfg.model.lora.publish == "adapter"):
        return cfg.model.path or resolve_base_model(cfg, show_progress=False)[0]
    path = tempfile.mkdtemp(prefix="heterorl-arch-")
    Policy.from_config(cfg.model, seed=cfg.seed).save(path)
    return path


def build_engine(cfg: RunConfig, base: str | None, seed: int) -> tuple[RolloutEngine, TextFormat]:
    """The rollout engine `sampler.engine` names, generating from `seed`, and the text format of its model."""
    name = cfg.sampler.engine.name
    if name == "transformers":
        from heterorl.engines.transformers_engine import TransformersEngine

        policy = sampler_policy(cfg, base)
        return TransformersEngine(policy, seed), policy.text
    if name == "vllm":  # an optional engine (its own install, `make vllm`): imported only when asked for
        try:
            module = importlib.import_module("heterorl.engines.vllm_engine")
        except ImportError as err:
            raise EngineError(f"sampler.engine vllm is not available here ({err}); see docs/howto-math.md") from None
        path = _checkpoint_dir(cfg, base)
        engine = module.VLLMEngine.from_config(cfg, path, seed)
        return engine, TextFormat(load_tokenizer(path), cfg.task.chat_template)
    raise EngineError(f"unknown sampler.engine {name!r}")


def build_sampler(cfg: RunConfig, index: int, base: str | None, task: Task | None = None) -> Sampler:
    """Sampler `index` of the cluster config, with its own seeded prompt, sampling and friction streams."""
    seed = sampler_seed(cfg.seed, index)
    engine, text = build_engine(cfg, base, seed)
    return Sampler(
        cfg.cluster.sampler_name(index),
        engine,
        text,
        task or build_task(cfg),
        SamplingParams.from_config(cfg.sampler),
        cfg.sampler.group_size,
        seed=seed,
        frictions=cfg.sampler.frictions,
        adversary=build_adversary(cfg, index, base, seed),
    )


def build_adversary(cfg: RunConfig, index: int, base: str | None, seed: int) -> Adversary | None:
    """Sampler `index`'s lies when `adversaries` names it; other_model generates with the base model (the warm
    start it was sent first, never updated) through its own transformers engine."""
    acfg = cfg.adversaries.get(cfg.cluster.sampler_name(index))
    if acfg is None:
        return None
    other = None
    if acfg.kind == "other_model":
        from heterorl.engines.transformers_engine import TransformersEngine

        policy = sampler_policy(cfg, base)
        other = TransformersEngine(policy, seed + 2)
        other.load_weights(0, {name: p.detach().clone() for name, p in policy.model.named_parameters()})
    return Adversary(acfg, seed + 3, other)
