"""Task config classes used by these tests."""

from heterorl.config import AdditionTaskConfig, GymTaskConfig, MathTaskConfig, ReversalTaskConfig, TaskConfig

__all__ = ["AdditionTaskConfig", "GymTaskConfig", "MathTaskConfig", "ReversalTaskConfig", "TaskConfig"]
