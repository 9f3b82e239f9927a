"""Everything a run records, whatever clock drives it: metrics.jsonl, periodic held-out evaluation, progress, and
at the end the checkpoint and summary.json.

Records carry `time/clock` (the driving clock's seconds: virtual in the simulator, wall in a live cluster) and
`time/wall` (real seconds since the run started); `CLOCK_DEPENDENT` names every key whose value depends on how
fast things ran, which is all that may differ between a simulated and a live run of the same synchronous config.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Protocol

from heterorl.config import RunConfig
from heterorl.console import Bar
from heterorl.evaluate import evaluate
from heterorl.learner import Learner
from heterorl.metrics import MetricsWriter
from heterorl.policy import SamplingParams
from heterorl.tasks import Task

CLOCK_DEPENDENT = re.compile(r"^(time/.*|perf/learner_idle|perf/tokens_per_sec|sampler/.+/idle)$")
"""Metric keys whose values depend on the speed of the machine or the clock (excluded when clocks are compared)."""


class Observer(Protocol):
    """Someone watching a run from code (`heterorl.api.Trainer`): sees every record, may ask it to finish."""

    @property
    def stop_requested(self) -> bool: ...

    def observe(self, record: dict[str, Any]) -> None: ...

    def started(self) -> None: ...


class RunRecorder:
    """metrics.jsonl, evaluation every `eval.every` steps, progress; checkpoint and summary.json at the end."""

    def __init__(self, cfg: RunConfig, run_dir: Path, learner: Learner, task: Task, bar: Bar) -> None:
        self.cfg, self.run_dir, self.learner, self.task, self.bar = cfg, run_dir, learner, task, bar
        self.metrics = MetricsWriter(run_dir / "metrics.jsonl")
        self.rewards: list[float] = []
        self.accuracies: list[float] = []
        self.last_eval_step: int | None = None
        self.start = time.monotonic()
        self.observer: Observer | None = None

    def wall(self) -> float:
        """Real seconds since the run started (across resumes)."""
        return time.monotonic() - self.start

    def _log(self, record: dict[str, Any]) -> None:
        self.metrics.log(record)
        if self.observer is not None:
            self.observer.observe(record)

    def evaluate(self, step: int, clock_time: float) -> float:
        """Held-out evaluation of the learner's weights (greedy accuracy; pass@k / maj@k with `eval.samples`)."""
        sampling = SamplingParams.from_config(self.cfg.sampler)
        seed = self.cfg.seed * 1_000_003 + step  # its own sampling stream, the same under every clock
        eval_set = self.task.eval_set()
        m = evaluate(
            self.learner.policy, self.task, eval_set, self.cfg.eval, self.cfg.sampler.max_new_tokens, sampling, seed
        )
        acc = m["eval/accuracy"]
        self.accuracies.append(acc)
        self.last_eval_step = step
        self._log({"kind": "eval", "step": step, "time/clock": clock_time, "time/wall": self.wall(), **m})
        return acc

    def on_step(self, record: dict[str, Any]) -> float | None:
        """Log a learner step; evaluate every `eval.every` steps and at the last one (-> the accuracy, else None)."""
        self._log(record)
        self.rewards.append(record["reward/mean"])
        step = record["step"]
        fields: dict[str, float] = {"reward": record["reward/mean"], "stale": record["stale/mean"]}
        accuracy = None
        if step % self.cfg.eval.every == 0 or step == self.cfg.learner.steps:
            accuracy = fields["acc"] = self.evaluate(step, record["time/clock"])
        self.bar.advance(1, **fields)
        return accuracy

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
            "rl_wall_seconds": self.wall(),
            **extra,
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        self._export_sinks()
        return summary

    def _export_sinks(self) -> None:
        """The optional sinks (TensorBoard, offline W&B), written from the complete metrics.jsonl."""
        sinks = self.cfg.metrics
        if sinks.tensorboard or sinks.wandb:
            from heterorl.sinks import tensorboard_export, wandb_export

            if sinks.tensorboard:
                tensorboard_export(self.run_dir)
            if sinks.wandb:
                wandb_export(self.run_dir, project=sinks.wandb_project, mode=sinks.wandb_mode)
