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


def make_task(cfg, rewards: bool = True) -> Task:  # cfg: heterorl.config.TaskConfig
    """Build the task named by `cfg.name` (validated by the config's discriminated union).

    With `cfg.reward` set, those functions replace the task's verifier as its training reward (`Task.score`);
    `rewards=False` leaves them out (held-out evaluation needs only the verifier, and a reward function may live
    where only the training processes can import it).
    """
    if cfg.name not in TASKS:
        raise ValueError(f"unknown task {cfg.name!r}; valid: {sorted(TASKS)}")
    specs = cfg.reward_specs if rewards else []
    custom = CustomReward(specs, cfg.reward_weights) if specs else None  # a bad path fails before data is read
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
