"""Model checkpoints during a run: every `checkpoint.every` steps, the last `keep_last` kept, and the best one by
held-out accuracy kept apart (`checkpoints/best`); the final weights always go to `checkpoint/`.

Every checkpoint is a transformers directory (safetensors + tokenizer + config; with LoRA the merged model and the
adapter in `adapter/`), written into a temporary name and renamed, so a checkpoint directory is always complete.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from heterorl.config import CheckpointConfig
from heterorl.learner import Learner


class CheckpointPolicy:
    """Decides after each step whether to write a checkpoint, and which ones to keep."""

    def __init__(self, cfg: CheckpointConfig, run_dir: Path, learner: Learner) -> None:
        self.cfg, self.learner = cfg, learner
        self.root = run_dir / "checkpoints"
        self.best_accuracy = self._saved_best()

    def _saved_best(self) -> float | None:
        meta = self.root / "best" / "best.json"
        return float(json.loads(meta.read_text())["accuracy"]) if meta.is_file() else None

    def _write(self, name: str, extra: dict | None = None) -> Path:
        final = self.root / name
        tmp = self.root / f".tmp-{name}"
        shutil.rmtree(tmp, ignore_errors=True)
        self.learner.save_checkpoint(tmp)
        if extra is not None:
            (tmp / "best.json").write_text(json.dumps(extra))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        return final

    def after_step(self, step: int, accuracy: float | None) -> list[Path]:
        """Checkpoints written after learner step `step` (`accuracy`: this step's evaluation, if it had one)."""
        written = []
        if self.cfg.every is not None and step % self.cfg.every == 0:
            written.append(self._write(f"step-{step:08d}"))
            periodic = sorted(p for p in self.root.glob("step-*") if p.is_dir())
            for old in periodic[: -self.cfg.keep_last]:
                shutil.rmtree(old)
        if (
            self.cfg.keep_best
            and accuracy is not None
            and (self.best_accuracy is None or accuracy > self.best_accuracy)
        ):
            self.best_accuracy = accuracy
            written.append(self._write("best", {"step": step, "accuracy": accuracy}))
        return written
