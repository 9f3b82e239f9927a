"""Task registry: config `name` -> task class."""

from __future__ import annotations

from heterorl.tasks.addition import AdditionTask
from heterorl.tasks.base import Problem, Task
from heterorl.tasks.reversal import ReversalTask

TASKS: dict[str, type[Task]] = {"addition": AdditionTask, "reversal": ReversalTask}


def make_task(cfg) -> Task:  # cfg: heterorl.config.TaskConfig
    """Build the task named by `cfg.name` (validated by the config's discriminated union)."""
    if cfg.name not in TASKS:
        raise ValueError(f"unknown task {cfg.name!r}; valid: {sorted(TASKS)}")
    return TASKS[cfg.name](cfg)


__all__ = ["TASKS", "Problem", "Task", "make_task"]
