"""The Python API: build and run a heterorl run from code. The `heterorl run` command is a thin layer over it.

    from heterorl import Callback, Trainer

    class StopAtTarget(Callback):
        def on_evaluate(self, trainer, record):
            if record["eval/accuracy"] >= 0.8:
                trainer.stop()                       # finish after this step: final checkpoint and summary

    trainer = Trainer("configs/smoke.yaml", overrides=["learner.steps=50"], callbacks=[StopAtTarget()])
    summary = trainer.fit()                          # the simulated cluster (virtual time)
    summary = Trainer("configs/smoke.yaml", run_dir="runs/live").fit(clock="live")   # local processes, wall clock

As TRL's GRPOTrainer takes them (docs/api.md has the table of TRL's arguments and heterorl's keys):

    trainer = Trainer(
        {"learner": {"steps": 50, "lr": 1e-5}, "sampler": {"group_size": 8}},   # a dict, a RunConfig or a path
        reward_funcs=[correct, short],               # f(prompts, completions, **kwargs) -> list[float], or paths
        reward_weights=[1.0, 0.5],                   # reward = 1.0 * correct + 0.5 * short
        train_dataset=dataset,                       # a datasets.Dataset with `prompt` and `answer` columns
    )

Reward functions and datasets become data before the run starts (`heterorl.inputs`): a function is named by
`module:function`, so a lambda or a function defined in the script you ran cannot reach sampler processes and
is refused under the live clock; a dataset becomes a content-addressed JSONL file.

Callbacks see every record as it is written to metrics.jsonl (`on_step` for learner steps, `on_evaluate` for
held-out evaluations), then the summary (`on_end`). They always run in this process: under the simulated clock
inside the run, between steps; under the live clock and with Ray as the learner process writes its records (the
learner is told to finish when a callback calls `stop()`), so they see every record but cannot change a step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from heterorl.config import RunConfig, load_config
from heterorl.inputs import check_importable_elsewhere, config_from, reward_specs, with_datasets
from heterorl.run.run_dir import new_run_dir

RewardFuncs = Callable[..., Any] | str | Sequence[Callable[..., Any] | str]

Clock = Literal["simulated", "live"]


class Callback:
    """Hooks a run calls; override the ones you need (each gets the trainer first)."""

    def on_start(self, trainer: Trainer) -> None:
        """Before the first step (after the initial evaluation under the simulated clock)."""

    def on_step(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """After every learner step, with its metrics record (docs/architecture.md lists the keys)."""

    def on_evaluate(self, trainer: Trainer, record: dict[str, Any]) -> None:
        """After every held-out evaluation (`eval/accuracy` and the step it was taken at)."""

    def on_end(self, trainer: Trainer, summary: dict[str, Any]) -> None:
        """After the run, with its summary (also in summary.json)."""


class Trainer:
    """One run: a config, a run directory, callbacks; and, as TRL's GRPOTrainer takes them, reward functions and
    in-memory datasets.

    config: a RunConfig, a dict of sections (TRL users: see docs/api.md), a YAML path, or None (the defaults);
        `overrides` (`dotted.key=value`) apply to any of them.
    reward_funcs: reward functions (callables defined at the top level of a module, or `module:function` paths)
        replacing the config's `task.reward`; `reward_weights`: their weights (default 1 each).
    train_dataset / eval_dataset: `datasets.Dataset`s with `prompt` and `answer` columns replacing the task's data
        (the math task reads them; its verifier gives held-out accuracy on `answer`). Extra columns reach batched
        reward functions as keyword arguments, as in TRL.
    """

    def __init__(
        self,
        config: RunConfig | Mapping[str, Any] | str | Path | None = None,
        *,
        overrides: Sequence[str] = (),
        run_dir: str | Path | None = None,
        callbacks: Sequence[Callback] = (),
        show_progress: bool = True,
        overwrite: bool = False,
        reward_funcs: RewardFuncs | None = None,
        reward_weights: Sequence[float] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
    ) -> None:
        if isinstance(config, RunConfig | Mapping):
            cfg = config_from(config, overrides)
        else:
            cfg = load_config(config, list(overrides))
        if eval_dataset is not None and train_dataset is None:
            raise ValueError("eval_dataset needs train_dataset (the held-out set of the task that reads it)")
        if train_dataset is not None:
            from heterorl.pretrain import cache_dir

            cfg = with_datasets(cfg, train_dataset, eval_dataset, cache_dir())
        if reward_funcs is not None or reward_weights is not None:
            data = cfg.model_dump(mode="json")
            if reward_funcs is not None:  # they replace the config's functions, and so its weights
                data["task"].update(reward=reward_specs(reward_funcs), reward_weights=None)
            if reward_weights is not None:
                data["task"]["reward_weights"] = list(reward_weights)
            cfg = config_from(data)
        self.cfg = cfg
        name = Path(config).stem if isinstance(config, str | Path) else "run"
        self.run_dir = Path(run_dir) if run_dir is not None else new_run_dir(name=name)
        self.callbacks = list(callbacks)
        self.show_progress = show_progress
        self.overwrite = overwrite
        self.summary: dict[str, Any] | None = None
        self._stop = False

    # ---------------------------------------------------------------- control
    def stop(self) -> None:
        """Finish after the current step: the run ends normally (final evaluation, checkpoint, summary)."""
        self._stop = True

    @property
    def stop_requested(self) -> bool:
        return self._stop

    def observe(self, record: dict[str, Any]) -> None:
        """Hand one metrics record to the callbacks (the drivers call this as records are written)."""
        for callback in self.callbacks:
            if record.get("kind") == "eval":
                callback.on_evaluate(self, record)
            else:
                callback.on_step(self, record)

    def started(self) -> None:
        for callback in self.callbacks:
            callback.on_start(self)

    # ---------------------------------------------------------------- running
    def fit(self, clock: Clock = "simulated", ray: str | None = None, resume: bool = False) -> dict[str, Any] | None:
        """Run to `learner.steps` (or `stop()`) on the chosen clock; returns the summary.

        Live runs start local processes, or Ray actors with `ray` ('local' or a cluster address). Callbacks run in
        this process under every clock. `resume` continues an interrupted live run in `run_dir`. Under torchrun the
        simulated run's learner spans the ranks; follower ranks return None.
        """
        if resume and (clock != "live" or ray is not None):
            raise ValueError("resume continues a live run of local processes (clock='live', no ray)")
        if clock == "simulated":
            from heterorl.parallel.distributed import run_as_rank
            from heterorl.simulated.run import execute

            def simulated() -> dict[str, Any]:
                return execute(self.cfg, self.run_dir, self.show_progress, overwrite=self.overwrite, observer=self)

            summary = run_as_rank(self.cfg, simulated)
            if summary is None:
                return None
        elif clock == "live" and ray is not None:
            check_importable_elsewhere(self.cfg.task.reward_specs)
            from heterorl.launch.ray import run_ray

            address = None if ray == "local" else ray
            summary = run_ray(self.cfg, self.run_dir, address, show_progress=self.show_progress, observer=self)
        elif clock == "live":
            check_importable_elsewhere(self.cfg.task.reward_specs)
            from heterorl.live.launcher import run_live

            summary = run_live(
                self.cfg, self.run_dir, self.show_progress, overwrite=self.overwrite, observer=self, resume=resume
            )
        else:
            raise ValueError(f"clock must be 'simulated' or 'live', got {clock!r}")
        self.summary = summary
        for callback in self.callbacks:
            callback.on_end(self, summary)
        return summary
