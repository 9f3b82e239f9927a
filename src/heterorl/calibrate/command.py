"""`heterorl calibrate RUN_DIR [--out CONFIG]`: measure, print what was measured and how sure it is, write the config.

The table and the config's path are results (stdout); what could not be measured goes to stderr, one line each.
"""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from heterorl.calibrate.measure import Calibration, calibrate_run
from heterorl.calibrate.records import CalibrationError, read_run
from heterorl.calibrate.write import calibrated_config, report_lines


def calibrate(run_dir: str | Path, out: str | Path | None = None) -> tuple[Calibration, Path]:
    """Calibrate from the live run in `run_dir`; writes the simulator config to `out` (default
    `<run_dir>/calibrated.yaml`) and returns the measurements and its path. CalibrationError if it cannot."""
    run_dir = Path(run_dir)
    records = read_run(run_dir)
    cal = calibrate_run(records)
    config = calibrated_config(records.config, cal)
    path = Path(out) if out is not None else run_dir / "calibrated.yaml"
    header = (
        f"# Calibrated by `heterorl calibrate` from the live run {run_dir}: sampler speeds and start-up delays,\n"
        "# the learner's cost per step and per token, measured link delays and rates (docs/planning.md).\n"
        "# Run it on the simulator: heterorl run <this file>\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + yaml.safe_dump(config, sort_keys=False))
    return cal, path


def calibrate_command(run_dir: Path, out: Path | None) -> None:
    """The command: exit code 2 with the reason on stderr when the run cannot be calibrated from."""
    from heterorl.console import console
    from heterorl.console import out as stdout

    try:
        cal, path = calibrate(run_dir, out)
    except CalibrationError as exc:
        console.print(str(exc), style="red", markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    for line in report_lines(cal):
        stdout.print(line, markup=False, soft_wrap=True)
    if cal.live:
        achieved = ", ".join(f"{k} {v:.3g}" for k, v in cal.live.items())
        stdout.print(f"the live run achieved: {achieved}", markup=False, soft_wrap=True)
    for note in cal.notes:
        console.print(note, style="yellow", markup=False, soft_wrap=True)
    stdout.print(f"config: {path}", soft_wrap=True)
