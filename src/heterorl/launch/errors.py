"""The error every launcher raises for a mistake the user can fix; the CLI prints it on one line."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """A launch cannot proceed (a missing extra, a wrong flag, an actor that cannot be placed); says what to do."""
