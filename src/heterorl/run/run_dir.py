"""Run directories: where a run writes config.yaml, metrics.jsonl, summary.json and its checkpoints.

A directory that already holds a run is never mixed with a new one: a run into it must say whether it continues
that run (`resume`) or replaces it (`overwrite`); otherwise metrics.jsonl would gain a second copy of every step.
"""

from __future__ import annotations

import shutil
from datetime import datetime
from pathlib import Path

from heterorl.config import RunConfig, config_to_yaml

RUN_FILES = ("metrics.jsonl", "summary.json")  # a config alone is a prepared run (e.g. by `run --live`), not a run


class RunDirError(ValueError):
    """The run directory cannot be used as asked; the message says what to pass instead."""


def new_run_dir(root: str | Path = "runs", name: str = "run") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path(root) / f"{stamp}-{name}"


def holds_run(run_dir: Path) -> bool:
    """True when `run_dir` holds (part of) a run that has started: its metrics or its summary."""
    return any((run_dir / name).exists() for name in RUN_FILES)


def prepare_run_dir(
    cfg: RunConfig, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False, resumable: bool = True
) -> Path:
    """Create the directory and write the resolved config into it.

    A directory holding a run is refused unless `resume` (continue it) or `overwrite` (delete it first).
    `resumable=False`: the caller has no `--resume` (simulated runs), so the refusal does not
    offer it."""
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise RunDirError("--resume and --overwrite exclude each other")
    if overwrite and run_dir.exists():
        shutil.rmtree(run_dir)
    elif run_dir.exists() and holds_run(run_dir) and not resume:
        how = "pass --resume to continue it, " if resumable else ""
        raise RunDirError(f"{run_dir} already holds a run: {how}--overwrite to replace it, or choose another --run-dir")
    elif resume and not holds_run(run_dir):
        raise RunDirError(f"--resume: {run_dir} holds no run to continue")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_to_yaml(cfg))
    return run_dir
