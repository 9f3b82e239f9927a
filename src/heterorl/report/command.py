"""`heterorl report`: make the report and print its summary table and where report.md is.

The table and the report's path are results (stdout); run directories left out and errors are warnings
(stderr), one line each.
"""

from __future__ import annotations

from pathlib import Path

import typer

from heterorl.report import side_by_side
from heterorl.report.document import make_report
from heterorl.report.runs import ReportError


def report_command(run_dirs: list[Path], out: Path, baseline: str | None, group_by: str | None = None) -> None:
    """Write the report of `run_dirs` (run directories or a sweep's output directory) into `out`; exit code 2
    with the reason on stderr if the inputs are unusable."""
    from rich.table import Table

    from heterorl.console import console, print_error
    from heterorl.console import out as stdout

    try:
        result = make_report(run_dirs, out, group_by=group_by, baseline=baseline)
    except ReportError as exc:
        print_error(str(exc))
        raise typer.Exit(2) from None
    for skipped in result.skipped:
        console.print(f"skipped {skipped.path}: {skipped.reason}", style="yellow", markup=False, soft_wrap=True)
    for path in result.unfinished:
        console.print(f"skipped {path}: unfinished (no summary.json)", style="yellow", markup=False, soft_wrap=True)
    table = Table(title="heterorl report", title_justify="left")
    table.add_column("group", overflow="fold")  # a name is what tells the rows apart: wrap it, never cut it
    for column in ("seeds", "best acc %", "last acc %", "staleness"):
        table.add_column(column, no_wrap=True)
    if baseline:
        table.add_column("Δ best (pts)", no_wrap=True)
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
    stdout.print(table)
    if result.clocks:
        header, rows = side_by_side.cells(result.clocks)
        compared = Table(title="simulated vs live", title_justify="left")
        for column in header:
            compared.add_column(column, overflow="fold")
        for row in rows:
            compared.add_row(*row)
        stdout.print(compared)
    for path, note in result.modelled:  # a plan's figures are a larger model's: one line each
        stdout.print(f"{path}: {note}", soft_wrap=True, markup=False, highlight=False)
    stdout.print(f"report: {result.report_md}", soft_wrap=True)  # one line, so it can be copied
