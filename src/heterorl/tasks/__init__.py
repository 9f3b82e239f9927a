"""Task registry: config `name` -> task class, and the custom-reward hook every task shares.

The math and gym tasks import their optional dependencies (math-verify, reasoning-gym, pyarrow, datasets) only
when built.
"""

from __future__ import annotations

from heterorl.tasks.addition import AdditionTask
from heterorl.tasks.base import Check, Problem, Task, stats_delta
from heterorl.tasks.gym import GymTask
from heterorl.tasks.math import MathTask
from heterorl.tasks.reversal import ReversalTask
from heterorl.tasks.reward import CustomReward, RewardError, RewardPathError

TASKS: dict[str, type[Task]] = {
    "addition": AdditionTask,
    "reversal": ReversalTask,
    "math": MathTask,
    "gym": GymTask,
}


def make_task(cfg) -> Task:  # cfg: heterorl.config.TaskConfig
    """Build the task named by `cfg.name` (validated by the config's discriminated union).

    With `cfg.reward` set, that function replaces the task's verifier as its training reward (`Task.score`).
    """
    if cfg.name not in TASKS:
        raise ValueError(f"unknown task {cfg.name!r}; valid: {sorted(TASKS)}")
    spec = cfg.reward
    custom = CustomReward(spec) if spec is not None else None  # a bad path fails before any data is read
    task = TASKS[cfg.name](cfg)
    task.custom_reward = custom
    return task


__all__ = [
    "TASKS",
    "Check",
    "CustomReward",
    "Problem",
    "RewardError",
    "RewardPathError",
    "Task",
    "make_task",
    "stats_delta",
]
