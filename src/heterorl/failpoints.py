"""Crash points for durability tests: `hit(name)` kills this process with SIGKILL (exactly what `kill -9` does)
when the environment variable HETERORL_FAILPOINT names that point, optionally its n-th hit (`name:n`, default 1).

A learner must recover from a kill at any instant; killing it from outside at a chosen instant (mid-save, between
a journal append and its acknowledgement) is a race, so the few points where the on-disk state changes are
named and tests (and benchmarks/kill9.py) make the process kill itself there. Unset, `hit` costs one lookup.
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "HETERORL_FAILPOINT"
_counts: dict[str, int] = {}
_lock = threading.Lock()


def hit(name: str) -> None:
    """SIGKILL this process if HETERORL_FAILPOINT is `name` (or `name:n` and this is the n-th hit)."""
    target = os.environ.get(ENV)
    if not target or not target.startswith(name):
        return
    point, _, nth = target.partition(":")
    if point != name:
        return
    with _lock:
        _counts[name] = _counts.get(name, 0) + 1
        if _counts[name] == (int(nth) if nth.isdigit() else 1):
            os.kill(os.getpid(), signal.SIGKILL)
