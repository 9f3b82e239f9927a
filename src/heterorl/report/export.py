"""Optional sinks: a run's metrics.jsonl replayed into TensorBoard event files (W&B: `report.wandb_sink`).

Neither package is a dependency of heterorl; each export imports its package when called and, if it is missing,
raises an error that names the package to install. Records are replayed in file order with their `step`, so
evaluation records land on the learner step they were taken at.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

from heterorl.errors import MissingDependencyError
from heterorl.metrics import read_metrics

NON_SCALARS = frozenset({"kind", "step"})


class MissingPackageError(MissingDependencyError):
    """An optional export was asked for but its package is not installed."""


def require(module: str, package: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MissingPackageError(f"{what} needs the `{package}` package: pip install {package}")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's numeric, finite values (booleans and nulls are not scalars to plot)."""
    return {
        k: float(v)
        for k, v in record.items()
        if k not in NON_SCALARS and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))
    }


def tensorboard_export(run_dir: Path, log_dir: Path | None = None) -> Path:
    """Write `run_dir`/metrics.jsonl as TensorBoard scalars (default log dir: `run_dir`/tensorboard)."""
    require("tensorboard", "tensorboard", "TensorBoard export")
    from torch.utils.tensorboard import SummaryWriter

    run_dir = Path(run_dir)
    log_dir = Path(log_dir) if log_dir is not None else run_dir / "tensorboard"
    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        for record in read_metrics(run_dir / "metrics.jsonl"):
            for key, value in scalars(record).items():
                writer.add_scalar(key, value, global_step=int(record["step"]))
    finally:
        writer.close()
    return log_dir
