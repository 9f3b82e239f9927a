"""`die_with_parent`: a child that must not outlive its parent (Linux), with real processes. A follower rank
ignores SIGTERM, so the SIGTERM a dead parent sends cannot end it: it asks for SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

CHILD = """
import os, signal, sys, time
from heterorl.process import die_with_parent
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a follower rank does
die_with_parent(int(sys.argv[2]), sig=signal.Signals[sys.argv[3]])
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(60)
"""

PARENT = """
import os, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], str(os.getpid()), sys.argv[3]])
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
time.sleep(0.1)  # the pid is written whole
os._exit(0)  # the parent goes, its child is left behind unless the kernel ends it
"""


def _orphan(tmp_path: Path, sig: str) -> int:
    """Start a parent whose child ignores SIGTERM and asked for `sig` at its parent's death; the parent exits.
    Returns the child's pid."""
    pid_file = tmp_path / f"child-{sig}.pid"
    subprocess.run([sys.executable, "-c", PARENT, CHILD, str(pid_file), sig], check=True, timeout=60)
    return int(pid_file.read_text())


def _alive_after(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False  # ended, not yet reaped
        time.sleep(0.05)
    return True


def test_a_child_that_ignores_sigterm_and_asks_for_sigkill_dies_with_its_parent(tmp_path: Path) -> None:
    assert not _alive_after(_orphan(tmp_path, "SIGKILL"), 10.0)


def test_a_child_that_ignores_sigterm_outlives_its_parent_if_it_asks_for_sigterm(tmp_path: Path) -> None:
    """Why followers ask for SIGKILL: the SIGTERM comes and is ignored (a follower whose agent was killed stayed
    in its collective for 90 minutes)."""
    pid = _orphan(tmp_path, "SIGTERM")
    try:
        assert _alive_after(pid, 1.0)
    finally:
        os.kill(pid, signal.SIGKILL)
