"""The Python API: build and run a heterorl run from code. The `heterorl run` command is a thin layer over it.

    from heterorl import Callback, Trainer

    class StopAtTarget(Callback):
        def on_evaluate(self, trainer, record):
            if record["eval/accuracy"] >= 0.8:
                trainer.stop()                       # finish after this step: final checkpoint and summary

    trainer = Trainer("configs/smoke.yaml", overrides=["learner.steps=50"], callbacks=[StopAtTarget()])
    summary = trainer.fit()                          # the simulated cluster (virtual time)
    summary = Trainer("configs/smoke.yaml", run_dir="runs/live").fit(clock="live")   # local processes, wall clock

Callbacks see every record as it is written to metrics.jsonl (`on_step` for learner steps, `on_evaluate` for
held-out evaluations), then the summary (`on_end`). Under the simulated clock they run inside the run, between
steps; under the live clock in this process, as the learner process writes its records (the learner is told to
finish when a callback calls `stop()`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from heterorl.config import RunConfig, load_config
from heterorl.run.run_dir import new_run_dir

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
    """One run: a config (a RunConfig, or a YAML path plus `overrides`), a run directory, callbacks."""

    def __init__(
        self,
        config: RunConfig | str | Path | None = None,
        *,
        overrides: Sequence[str] = (),
        run_dir: str | Path | None = None,
        callbacks: Sequence[Callback] = (),
        show_progress: bool = True,
        overwrite: bool = False,
    ) -> None:
        if isinstance(config, RunConfig):
            if overrides:
                raise ValueError("overrides apply to a config file; change the RunConfig object instead")
            self.cfg = config
        else:
            self.cfg = load_config(config, list(overrides))
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

        Live runs start local processes, or Ray actors with `ray` ('local' or a cluster address; callbacks are not
        supported there); `resume` continues an interrupted live run in `run_dir`. Under torchrun the simulated
        run's learner spans the ranks; follower ranks return None.
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
            if self.callbacks:
                raise ValueError("callbacks are not supported with Ray actors; use clock='live' without ray")
            from heterorl.launch.ray import run_ray

            summary = run_ray(
                self.cfg, self.run_dir, address=None if ray == "local" else ray, show_progress=self.show_progress
            )
        elif clock == "live":
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
