"""Errors that mean "what you set up is wrong", not "heterorl has a bug".

The CLI prints any `SetupError` as one line naming the config field, file or function at fault, and exits 1;
every other exception keeps its traceback, because it is a bug to report. Each class also derives from the
built-in error it refines, so `except FileNotFoundError` / `except ValueError` code keeps working.
"""

from __future__ import annotations


class SetupError(Exception):
    """A problem with the user's setup: a path, a data file, a missing package, a reward function."""


class PathNotFoundError(SetupError, FileNotFoundError):
    """A path named by the config (model.path, task.path, a checkpoint) does not exist or is not what it should
    be."""


class DataError(SetupError, ValueError):
    """A data source named by the config is unusable: empty, malformed, missing a field, unreachable."""


class MissingDependencyError(SetupError, ImportError):
    """An optional package a chosen feature needs is not installed; the message says what to install."""
