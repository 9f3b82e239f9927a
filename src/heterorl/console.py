"""Console output: progress for long work, and short results at the end.

Two streams, so that `heterorl run ... > log` keeps what matters: results (run summaries, report tables) go to
stdout through `out`; progress, warnings and errors go to stderr through `console`.

Progress has two forms. On a terminal it is a rich bar redrawn in place. Anywhere else (nohup, CI, Slurm,
`2> log`) a redrawn bar would print nothing until it ends, so progress becomes plain lines: one when the work
starts, one every `interval_s` seconds while it advances, and one at the end. Given a `log_path` (a run's
`run.log`), the same plain lines are also appended to that file, whatever the terminal and even with the bar
disabled (`--quiet`), so a run directory always says how the run went.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)  # progress, warnings, errors
out = Console()  # results: summaries and tables

ERROR_PREFIX = "heterorl: error: "  # every command's mistakes start so (heterorl.cli_errors)
PROGRESS_INTERVAL_S = 15.0  # between plain progress lines: often enough to see life, rare enough for a log


def print_note(message: str) -> None:
    """Something the user should know while a command goes on (not a mistake), on stderr in yellow."""
    console.print("heterorl: " + message, style="yellow", markup=False, highlight=False, soft_wrap=True)


def print_error(message: str) -> None:
    """One mistake on stderr, in red, with the prefix every command uses."""
    console.print(ERROR_PREFIX + message, style="red", markup=False, highlight=False, soft_wrap=True)


def format_fields(fields: dict[str, float | str]) -> str:
    """`loss=0.123  acc=0.5`: the latest values passed to `Bar.advance`, floats to 3 significant digits."""
    return "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())


def format_duration(seconds: float) -> str:
    """`0:01:05`: hours, minutes, seconds (as rich's bar shows them)."""
    s = max(0, round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class ProgressLines:
    """Plain progress lines written to some streams: at the start, every `interval_s` seconds of `clock` when the
    work advances, and at the end. A line: `[2025-01-31 12:00:00] RL 12/100 (12%) elapsed 0:01:23
    left ~0:10:08  reward=0.31  acc=0.5`."""

    def __init__(
        self,
        description: str,
        total: int,
        streams: list[TextIO],
        interval_s: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.description, self.total, self.streams = description, total, streams
        self.interval_s, self.clock = interval_s, clock
        self.start = self.last = clock()

    def line(self, done: int, fields: dict[str, float | str], final: bool = False) -> str:
        elapsed = self.clock() - self.start
        parts = [f"{self.description} {done}/{self.total}"]
        if self.total > 0:
            parts.append(f"({done / self.total:.0%})")
        parts.append(f"elapsed {format_duration(elapsed)}")
        if final:
            parts.append("done" if done >= self.total else "stopped")
        elif 0 < done < self.total:
            parts.append(f"left ~{format_duration(elapsed / done * (self.total - done))}")
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        info = format_fields(fields)
        return f"[{stamp}] " + " ".join(parts) + (f"  {info}" if info else "")

    def write(self, done: int, fields: dict[str, float | str], final: bool = False) -> None:
        text = self.line(done, fields, final) + "\n"
        for stream in self.streams:
            stream.write(text)
            stream.flush()  # a log read while the run goes on (tail -f) shows every line at once
        self.last = self.clock()

    def update(self, done: int, fields: dict[str, float | str]) -> None:
        """Write a line if `interval_s` has passed since the last one."""
        if self.clock() - self.last >= self.interval_s:
            self.write(done, fields)


class Bar:
    """Progress whose trailing text shows the latest values passed to `advance` (loss=..., acc=...): a rich bar,
    plain lines, both, or neither (disabled)."""

    def __init__(
        self, progress: Progress | None = None, task_id: int | None = None, lines: ProgressLines | None = None
    ) -> None:
        self._progress, self._task, self._lines = progress, task_id, lines
        self._fields: dict[str, float | str] = {}
        self.done = 0

    def advance(self, n: int = 1, **fields: float | str) -> None:
        self.done += n
        self._fields.update(fields)
        if self._progress is not None:
            self._progress.update(self._task, advance=n, info=format_fields(self._fields))
        if self._lines is not None:
            self._lines.update(self.done, self._fields)

    def _start(self) -> None:
        if self._lines is not None:
            self._lines.write(self.done, self._fields)

    def _finish(self) -> None:
        if self._lines is not None:
            self._lines.write(self.done, self._fields, final=True)


@contextmanager
def progress_bar(
    description: str,
    total: int,
    enabled: bool = True,
    log_path: str | Path | None = None,
    *,
    interval_s: float = PROGRESS_INTERVAL_S,
    stream: TextIO | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Bar]:
    """Progress of `total` units of work (count, elapsed, remaining, latest values).

    enabled: show progress on `stream` (default stderr): a rich bar on a terminal, plain lines elsewhere.
    log_path: also append plain lines to this file (created with its parents), even when not enabled.
    """
    with ExitStack() as stack:
        target = stream if stream is not None else sys.stderr
        term = console if stream is None else Console(file=stream)
        interactive = term.is_terminal or term.is_jupyter
        streams: list[TextIO] = []
        if enabled and not interactive:
            streams.append(target)
        if log_path is not None:
            path = Path(log_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            streams.append(stack.enter_context(path.open("a", encoding="utf-8")))
        lines = ProgressLines(description, total, streams, interval_s, clock) if streams else None
        progress, task_id = None, None
        if enabled and interactive:
            columns = (
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
            )
            progress = stack.enter_context(Progress(*columns, console=term, transient=False))
            task_id = progress.add_task(description, total=total, info="")
        bar = Bar(progress, task_id, lines)
        bar._start()
        try:
            yield bar
        finally:
            bar._finish()
