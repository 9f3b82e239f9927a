"""Console output: progress bars for long work and short summaries at the end (rich)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)


class Bar:
    """A progress bar whose trailing text shows the latest values passed to `advance` (loss=..., acc=...)."""

    def __init__(self, progress: Progress | None, task_id: int | None) -> None:
        self._progress, self._task, self._fields = progress, task_id, {}

    def advance(self, n: int = 1, **fields: float | str) -> None:
        if self._progress is None:
            return
        self._fields.update(fields)
        info = "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in self._fields.items())
        self._progress.update(self._task, advance=n, info=info)


@contextmanager
def progress_bar(description: str, total: int, enabled: bool = True) -> Iterator[Bar]:
    """A rich progress bar (count, elapsed, remaining, latest values); a silent stand-in when disabled."""
    if not enabled:
        yield Bar(None, None)
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        yield Bar(progress, progress.add_task(description, total=total, info=""))
