"""Run directories: where a run writes config.yaml, metrics.jsonl, summary.json and its checkpoints."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from heterorl.config import RunConfig, config_to_yaml


def new_run_dir(root: str | Path = "runs", name: str = "run") -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return Path(root) / f"{stamp}-{name}"


def prepare_run_dir(cfg: RunConfig, run_dir: str | Path) -> Path:
    """Create the directory and write the resolved config into it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_to_yaml(cfg))
    return run_dir
