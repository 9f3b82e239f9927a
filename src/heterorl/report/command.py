"""`heterorl report`: make the report and print its summary table and where report.md is."""

from __future__ import annotations

from pathlib import Path

import typer

from heterorl.report.document import make_report
from heterorl.report.runs import ReportError


def report_command(run_dirs: list[Path], out: Path, baseline: str | None, group_by: str | None = None) -> None:
    """Write the report of `run_dirs` (run directories or a sweep's output directory) into `out`; exit code 2
    with the reason on stderr if the inputs are unusable."""
    from rich.table import Table

    from heterorl.console import console

    try:
        result = make_report(run_dirs, out, group_by=group_by, baseline=baseline)
    except ReportError as exc:
        console.print(str(exc), style="red", markup=False)
        raise typer.Exit(2) from None
    table = Table(title="heterorl report", title_justify="left")
    for column in ("group", "seeds", "best acc %", "last acc %", "staleness"):
        table.add_column(column)
    if baseline:
        table.add_column("Δ best (pts)")
    for g in result.groups:
        s = g.stats
        row = [
            g.name,
            str(len(g.seeds)),
            f"{s['best_accuracy'].mean * 100:.1f} ± {s['best_accuracy'].std * 100:.1f}",
            f"{s['last_accuracy'].mean * 100:.1f} ± {s['last_accuracy'].std * 100:.1f}",
            f"{s['staleness_mean'].mean:.2f}",
        ]
        table.add_row(*row, *([f"{g.best_delta * 100:+.1f}"] if baseline else []))
    console.print(table)
    if result.unfinished:
        console.print(f"{len(result.unfinished)} unfinished runs left out", style="yellow")
    console.print(f"report: {result.report_md}", soft_wrap=True)  # one line, so it can be copied
