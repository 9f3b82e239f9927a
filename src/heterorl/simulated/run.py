"""One run, end to end, on the simulated clock: base model -> learner and samplers -> the loop -> checkpoint,
summary. (`heterorl.live.launcher` is the same run on local processes and the wall clock.)

A run directory holds: config.yaml (resolved), metrics.jsonl (one record per learner step and per evaluation),
summary.json and checkpoint/ (transformers-loadable).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from heterorl.config import RunConfig
from heterorl.console import Bar, console, print_note, progress_bar
from heterorl.loop.learner_loop import LearnerLoop
from heterorl.loop.worker import SamplerWorker
from heterorl.parallel.distributed import attach
from heterorl.run.build import (
    build_learner,
    build_sampler,
    build_task,
    check_sinks,
    check_traces,
    configure_torch,
    resolve_base_model,
)
from heterorl.run.recorder import Observer, RunRecorder
from heterorl.run.run_dir import prepare_run_dir
from heterorl.simulated.cluster import SimulatedCluster
from heterorl.simulated.events import EventLoop
from heterorl.simulated.shared_weights import SharedReceiver
from heterorl.transport.simulated.modelled import modelled_note


def build_simulated(cfg: RunConfig, run_dir: Path, base: str, bar: Bar | None = None) -> SimulatedCluster:
    """The learner loop and every sampler worker of `cfg` on a fresh virtual clock, recording into `run_dir`."""
    task = build_task(cfg)
    learner = build_learner(cfg, base)
    attach(learner)  # with several ranks: rank 0 shares it (heterorl.parallel.distributed); else nothing
    workers = [
        SamplerWorker(cfg, i, build_sampler(cfg, i, base, task), SharedReceiver(workers=cfg.weights.codec_threads))
        for i in range(len(cfg.cluster.samplers))
    ]
    events = EventLoop()
    recorder = RunRecorder(cfg, run_dir, learner, task, bar or Bar(None, None))
    loop = LearnerLoop(cfg, learner, recorder, clock=lambda: events.now)
    return SimulatedCluster(cfg, loop, workers, events)


def execute(
    cfg: RunConfig,
    run_dir: str | Path,
    show_progress: bool = True,
    overwrite: bool = False,
    observer: Observer | None = None,
) -> dict[str, Any]:
    """Run `cfg` on the simulated cluster into `run_dir` (refused if it holds a run, unless `overwrite`); returns
    the summary (also in summary.json). `observer` sees every record and may ask the run to finish early."""
    wall_start = time.monotonic()
    check_traces(cfg)
    run_dir = prepare_run_dir(cfg, run_dir, overwrite=overwrite, resumable=False)
    check_sinks(cfg)
    configure_torch(cfg)
    base, pretrain_info = resolve_base_model(cfg, show_progress)
    with progress_bar("RL", total=cfg.learner.steps, enabled=show_progress, log_path=run_dir / "run.log") as bar:
        cluster = build_simulated(cfg, run_dir, base, bar)
        if cluster.warning is not None:
            console.print(f"[yellow]warning:[/yellow] {cluster.warning}")
        computed = sum(p.numel() for p in cluster.loop.learner.policy.model.parameters())  # tied ones once
        note = modelled_note(cfg, computed)
        if note is not None:  # a plan's figures are a larger model's: say so before and after
            print_note(note)
            with (run_dir / "run.log").open("a", encoding="utf-8") as log:
                log.write(f"heterorl: {note}\n")
        cluster.loop.recorder.observer = observer
        try:
            cluster.run()
        finally:
            cluster.loop.publisher.close()
            cluster.close()
    loop = cluster.loop
    loop.extra = {
        "base_model": str(base),
        "pretrain": pretrain_info,
        "clock": "virtual",
        **cluster.summary(),
        **_modelled_summary(cfg, note, computed),
        "wall_seconds": time.monotonic() - wall_start,
    }
    return loop.finish()


def _modelled_summary(cfg: RunConfig, note: str | None, computed: int) -> dict[str, Any]:
    """summary.json's `modelled`: the section as configured, the small model's size and the label line."""
    if note is None or cfg.cluster.modelled is None:
        return {}
    return {"modelled": {**cfg.cluster.modelled.model_dump(), "computed_parameters": computed, "note": note}}
