"""A child process that must not outlive the process that started it (Linux).

`run --live` starts the learner and the samplers, torchrun starts the learner's ranks; each such child calls
`die_with_parent()` first. The kernel then sends it SIGTERM when its parent dies, however it dies (SIGKILL
included), so no learner, sampler or rank is left serving on its own. SIGTERM is the same signal an orderly
shutdown sends: a learner still saves its state. A process that ignores SIGTERM (a follower rank of the learner:
rank 0 decides when the run ends) asks for SIGKILL instead, or it would outlive its parent after all. Elsewhere
(not Linux) it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(expected_parent: int | None = None, sig: signal.Signals = signal.SIGTERM) -> bool:
    """Ask the kernel to send this process `sig` when its parent dies; True when it was set. `expected_parent` (the
    starter's pid, e.g. from the environment) closes the race of a parent that died before this call: then this
    process sends itself `sig` at once."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)
    return True
