"""Structured event lines of the live processes: one JSON object per line, flushed at once.

The learner logs `listening`, `published` (version and state hash), `checkpoint`, `resumed`, `finished`; a
sampler logs `started`, `weights` (the version and the hash it verified after every update), `pushed`,
`retry`, `finished`. Machines (run --live, tests, log shippers) read them; humans can grep them.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO


class EventLog:
    """Writes `{"event": name, "t": unix time, **fields}` lines to a stream (stdout by default)."""

    def __init__(self, stream: TextIO | None = None, **context: Any) -> None:
        self.stream = stream
        self.context = context
        self.dropped = 0  # lines the stream refused (a full disk): logging must never stop the process
        self._lock = threading.Lock()  # the training thread and the event loop both log

    def emit(self, event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "t": round(time.time(), 3), **self.context, **fields}, sort_keys=True)
        stream = self.stream or sys.stdout
        with self._lock:
            try:
                stream.write(line + "\n")
                stream.flush()
            except OSError:
                self.dropped += 1


def read_events(path: str | Path, event: str | None = None) -> list[dict[str, Any]]:
    """The JSON event lines of a log file (other lines, e.g. warnings on the same stream, are skipped)."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a kill
            if event is None or record.get("event") == event:
                out.append(record)
    return out
