"""One run, end to end: base model -> learner and samplers -> the cluster -> metrics, checkpoint, summary.

A run directory holds: config.yaml (resolved), metrics.jsonl (one record per learner step and per evaluation),
summary.json, checkpoint/ (transformers-loadable) and, when asked, plots.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from heterorl.config import RunConfig, config_to_yaml
from heterorl.console import Bar, progress_bar
from heterorl.evaluate import greedy_accuracy
from heterorl.learner import Learner
from heterorl.lora import apply_lora
from heterorl.metrics import MetricsWriter
from heterorl.policy import Policy, SamplingParams, resolve_device
from heterorl.pretrain import ensure_base_model
from heterorl.sampler import Sampler
from heterorl.simulated.cluster import SimulatedCluster
from heterorl.tasks import Task, make_task


def new_run_dir(root: str | Path = "runs", name: str = "run") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path(root) / f"{stamp}-{name}"


def sampler_seed(seed: int, index: int) -> int:
    """Independent, reproducible stream per sampler (prompts and sampling)."""
    return seed * 1_000_003 + 7919 * (index + 1)


def resolve_base_model(cfg: RunConfig, show_progress: bool = True) -> tuple[str, dict[str, Any]]:
    """`model.path`, or the cached warm start built from the config (and how it was built)."""
    if cfg.model.path is not None:
        return cfg.model.path, {}
    result = ensure_base_model(cfg, show_progress=show_progress)
    return result.path, {"steps": result.steps, "val_accuracy": result.val_accuracy}


def make_learner(cfg: RunConfig, base: str) -> Learner:
    """The learner: fp32 master weights of the base model (with fresh LoRA adapters when configured)."""
    device = resolve_device(cfg.model.device)
    return Learner(Policy.load(base, device, chat_template=cfg.task.chat_template), cfg)


def make_sampler(cfg: RunConfig, base: str, index: int, task: Task | None = None) -> Sampler:
    """Sampler `index` of the cluster config, with its own seeded prompt and sampling streams."""
    node = cfg.cluster.samplers[index]
    dtype = getattr(torch, cfg.model.dtype)
    policy = Policy.load(base, resolve_device(cfg.model.device), dtype, chat_template=cfg.task.chat_template)
    if cfg.model.lora is not None and cfg.model.lora.publish == "adapter":
        policy.model = apply_lora(policy.model, cfg.model.lora)  # receives adapter tensors only
    return Sampler.from_policy(
        node.name or f"sampler-{index}",
        policy,
        task or make_task(cfg.task),
        SamplingParams.from_config(cfg.sampler),
        cfg.sampler.group_size,
        seed=sampler_seed(cfg.seed, index),
        frictions=cfg.sampler.frictions,
    )


class RunRecorder:
    """Everything a run records, whatever clock drives it: metrics.jsonl, periodic held-out evaluation,
    progress, and at the end the checkpoint and summary.json."""

    def __init__(self, cfg: RunConfig, run_dir: Path, learner: Learner, task: Task, bar: Bar) -> None:
        self.cfg, self.run_dir, self.learner, self.task, self.bar = cfg, run_dir, learner, task, bar
        self.metrics = MetricsWriter(run_dir / "metrics.jsonl")
        self.rewards: list[float] = []
        self.accuracies: list[float] = []
        self.start = time.monotonic()

    def evaluate(self, step: int, clock_time: float) -> float:
        acc = greedy_accuracy(self.learner.policy, self.task, self.task.eval_set(), self.cfg.sampler.max_new_tokens)
        self.accuracies.append(acc)
        self.metrics.log({"kind": "eval", "step": step, "time/virtual": clock_time, "eval/accuracy": acc})
        return acc

    def on_step(self, record: dict[str, Any]) -> None:
        """Log a learner step; evaluate every `eval.every` steps and at the last one."""
        self.metrics.log(record)
        self.rewards.append(record["reward/mean"])
        step = record["step"]
        fields: dict[str, float] = {"reward": record["reward/mean"], "stale": record["stale/mean"]}
        if step % self.cfg.eval.every == 0 or step == self.cfg.learner.steps:
            fields["acc"] = self.evaluate(step, record["time/virtual"])
        self.bar.advance(1, **fields)

    def finish(self, extra: dict[str, Any]) -> dict[str, Any]:
        """Save the checkpoint and write summary.json (`extra`: the driver's own figures)."""
        self.metrics.close()
        self.learner.save_checkpoint(self.run_dir / "checkpoint")
        k = max(1, min(10, len(self.rewards) // 4))
        summary = {
            "accuracy_initial": self.accuracies[0],
            "accuracy_final": self.accuracies[-1],
            "accuracy_best": max(self.accuracies),
            "reward_first": sum(self.rewards[:k]) / k,
            "reward_last": sum(self.rewards[-k:]) / k,
            "steps": len(self.rewards),
            "objective": self.cfg.objective.name,
            "mode": self.cfg.cluster.mode,
            "rl_wall_seconds": time.monotonic() - self.start,
            **extra,
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self._export_sinks()
        return summary

    def _export_sinks(self) -> None:
        """The optional sinks (TensorBoard, offline W&B), written from the complete metrics.jsonl."""
        sinks = self.cfg.metrics
        if sinks.tensorboard or sinks.wandb:
            from heterorl.report import tensorboard_export, wandb_export

            if sinks.tensorboard:
                tensorboard_export(self.run_dir)
            if sinks.wandb:
                wandb_export(self.run_dir, project=sinks.wandb_project)


def prepare_run_dir(cfg: RunConfig, run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_to_yaml(cfg))
    return run_dir


def execute(cfg: RunConfig, run_dir: str | Path, show_progress: bool = True) -> dict[str, Any]:
    """Run `cfg` on the simulated cluster into `run_dir`; returns the summary (also in summary.json)."""
    wall_start = time.monotonic()
    run_dir = prepare_run_dir(cfg, run_dir)
    torch.manual_seed(cfg.seed)
    base, pretrain_info = resolve_base_model(cfg, show_progress)
    task = make_task(cfg.task)
    learner = make_learner(cfg, base)
    samplers = [make_sampler(cfg, base, i, task) for i in range(len(cfg.cluster.samplers))]
    with progress_bar("RL", total=cfg.learner.steps, enabled=show_progress) as bar:
        recorder = RunRecorder(cfg, run_dir, learner, task, bar)
        recorder.evaluate(step=0, clock_time=0.0)
        cluster = SimulatedCluster(cfg, learner, samplers, recorder.on_step)
        cluster.run()
    extra = {
        "base_model": str(base),
        "pretrain": pretrain_info,
        **cluster.summary(),
        "wall_seconds": time.monotonic() - wall_start,
    }
    return recorder.finish(extra)
