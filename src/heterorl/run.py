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

from heterorl.cluster.simulated import SimulatedCluster
from heterorl.config import RunConfig, config_to_yaml
from heterorl.console import progress_bar
from heterorl.evaluate import greedy_accuracy
from heterorl.learner import Learner
from heterorl.metrics import MetricsWriter
from heterorl.policy import Policy, SamplingParams, resolve_device
from heterorl.pretrain import ensure_base_model
from heterorl.sampler import Sampler
from heterorl.tasks import make_task


def new_run_dir(root: str | Path = "runs", name: str = "run") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path(root) / f"{stamp}-{name}"


def sampler_seed(seed: int, index: int) -> int:
    """Independent, reproducible stream per sampler (prompts and sampling)."""
    return seed * 1_000_003 + 7919 * (index + 1)


def execute(cfg: RunConfig, run_dir: str | Path, show_progress: bool = True) -> dict[str, Any]:
    """Run `cfg` into `run_dir` and return the summary (also written to summary.json)."""
    wall_start = time.monotonic()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_to_yaml(cfg))
    torch.manual_seed(cfg.seed)

    base = cfg.model.path
    pretrain_info: dict[str, Any] = {}
    if base is None:
        result = ensure_base_model(cfg, show_progress=show_progress)
        base, pretrain_info = result.path, {"steps": result.steps, "val_accuracy": result.val_accuracy}
    task = make_task(cfg.task)
    dev = resolve_device(cfg.model.device)
    learner = Learner(Policy.load(base, dev), cfg)
    params = SamplingParams.from_config(cfg.sampler)
    samplers = [
        Sampler(
            node.name or f"sampler-{i}",
            Policy.load(base, dev),
            task,
            params,
            cfg.sampler.group_size,
            seed=sampler_seed(cfg.seed, i),
        )
        for i, node in enumerate(cfg.cluster.samplers)
    ]
    eval_set = task.eval_set()
    max_new = cfg.sampler.max_new_tokens

    def evaluate() -> float:
        return greedy_accuracy(learner.policy, task, eval_set, max_new)

    rl_start = time.monotonic()
    accuracy_initial = evaluate()
    accuracies = [accuracy_initial]
    rewards: list[float] = []
    with (
        MetricsWriter(run_dir / "metrics.jsonl") as metrics,
        progress_bar("RL", total=cfg.learner.steps, enabled=show_progress) as bar,
    ):
        metrics.log({"kind": "eval", "step": 0, "time/virtual": 0.0, "eval/accuracy": accuracy_initial})

        def on_step(record: dict[str, Any]) -> None:
            metrics.log(record)
            rewards.append(record["reward/mean"])
            step = record["step"]
            fields: dict[str, float] = {"reward": record["reward/mean"], "stale": record["stale/mean"]}
            if step % cfg.eval.every == 0 or step == cfg.learner.steps:
                accuracies.append(evaluate())
                metrics.log(
                    {
                        "kind": "eval",
                        "step": step,
                        "time/virtual": record["time/virtual"],
                        "eval/accuracy": accuracies[-1],
                    }
                )
                fields["acc"] = accuracies[-1]
            bar.advance(1, **fields)

        cluster = SimulatedCluster(cfg, learner, samplers, on_step)
        cluster.run()
    rl_seconds = time.monotonic() - rl_start
    learner.save_checkpoint(run_dir / "checkpoint")
    k = max(1, min(10, len(rewards) // 4))
    summary = {
        "accuracy_initial": accuracy_initial,
        "accuracy_final": accuracies[-1],
        "accuracy_best": max(accuracies),
        "reward_first": sum(rewards[:k]) / k,
        "reward_last": sum(rewards[-k:]) / k,
        "steps": cluster.steps_done,
        "objective": cfg.objective.name,
        "mode": cfg.cluster.mode,
        "wall_seconds": time.monotonic() - wall_start,
        "rl_wall_seconds": rl_seconds,
        "base_model": str(base),
        "pretrain": pretrain_info,
        **cluster.summary(),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
