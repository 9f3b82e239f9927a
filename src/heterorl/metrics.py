"""Metric sinks. metrics.jsonl always (one JSON object per learner step and per evaluation).

Keys are namespaced: `reward/`, `eval/`, `obj/` (the objective's statistics), `opt/`, `stale/`, `sync/`,
`perf/`, `time/`; docs/architecture.md defines each. Fields that depend on the wall clock live under
`time/wall*` so determinism checks can ignore them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
from collections import deque
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    """JSON-safe values: non-finite floats become None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


class MetricsWriter:
    """Appends one JSON object per record to `metrics.jsonl`, written at once so a crash loses nothing.

    A record the disk refuses (full) stays in memory, in order, and is written before the next one, or by
    `flush`, which a learner calls before it saves a state (that state must not claim records the file lacks);
    a failed write is cut back, so the file only ever holds whole lines.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("ab", buffering=0)
        self._pending: deque[bytes] = deque()

    def log(self, record: dict[str, Any]) -> None:
        self._pending.append((json.dumps(_clean(record), sort_keys=True) + "\n").encode())
        with contextlib.suppress(OSError):  # disk full: kept, written with the next record or by flush()
            self.flush()

    def flush(self) -> None:
        """Write the records kept back; raises OSError (keeping them) if the disk still refuses."""
        while self._pending:
            line = memoryview(self._pending[0])
            start = self._file.seek(0, os.SEEK_END)
            try:
                while line:
                    written = self._file.write(line)
                    if not written:
                        raise OSError(errno.EIO, "metrics.jsonl accepted no bytes")
                    line = line[written:]
            except OSError:
                with contextlib.suppress(OSError):
                    self._file.truncate(start)
                raise
            self._pending.popleft()

    @property
    def pending(self) -> int:
        """Records not yet on disk."""
        return len(self._pending)

    def close(self) -> None:
        if self._file.closed:
            return
        with contextlib.suppress(OSError):
            self.flush()
        self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file."""
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
