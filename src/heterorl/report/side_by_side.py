"""Simulated and live runs side by side: does the simulator predict the cluster? (docs/planning.md)

When the report's runs include both clocks (summary.json `clock`: `virtual` for the simulator, `wall` for a live
cluster), the report adds a table and a figure, one column (one colour) per run:

- throughput: tokens of accepted groups per clock second (`tokens_per_clock_second`);
- staleness of the trained groups: mean, p90 and max from the run's histogram, and the histogram itself;
- the learner's idle share (clock time not spent training);
- per sampler: its share of the trained groups and their mean staleness (`per_sampler`).

With one simulated run, a last column gives its error against the live runs' mean: relative for throughput and
mean staleness, in steps for p90, in points for shares. With several live runs their spread (sample std) is shown
beside it, so a prediction error can be read against how much live runs differ among themselves.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from heterorl.report.runs import RunData

CLOCK_NAMES = {"virtual": "simulated", "wall": "live"}


@dataclass
class ClockFigures:
    """One run's figures for the comparison (NaN where the run did not record them)."""

    name: str  # "simulated: <dir>" / "live: <dir>"
    clock: str  # virtual | wall
    throughput: float
    staleness_mean: float
    staleness_p90: float
    staleness_max: float
    learner_idle: float
    histogram: dict[int, int]
    sampler_share: dict[str, float] = field(default_factory=dict)
    sampler_staleness: dict[str, float] = field(default_factory=dict)

    @property
    def simulated(self) -> bool:
        return self.clock == "virtual"


def percentile(histogram: dict[int, int], q: float) -> float:
    """The smallest staleness s with P(staleness <= s) >= q (NaN for an empty histogram)."""
    total = sum(histogram.values())
    if not total:
        return math.nan
    seen = 0
    for s in sorted(histogram):
        seen += histogram[s]
        if seen >= q * total:
            return float(s)
    return float(max(histogram))


def clock_figures(run: RunData) -> ClockFigures:
    s = run.summary or {}
    clock = str(s.get("clock", "virtual"))
    hist = {int(k): int(v) for k, v in (s.get("staleness_histogram") or {}).items()}
    per = s.get("per_sampler") or {}
    total = sum(hist.values())
    mean = sum(k * v for k, v in hist.items()) / total if total else math.nan
    return ClockFigures(
        name=f"{CLOCK_NAMES.get(clock, clock)}: {run.path.name}",
        clock=clock,
        throughput=float(s.get("tokens_per_clock_second", math.nan)),
        staleness_mean=mean,
        staleness_p90=percentile(hist, 0.9),
        staleness_max=float(max(hist)) if hist else math.nan,
        learner_idle=float(s.get("learner_idle", math.nan)),
        histogram=hist,
        sampler_share={n: float(v["trained_share"]) for n, v in per.items()},
        sampler_staleness={n: _num(v.get("staleness_mean")) for n, v in per.items()},
    )


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def both_clocks(runs: list[RunData]) -> bool:
    """Do the runs include a simulated and a live one?"""
    clocks = {str((r.summary or {}).get("clock", "virtual")) for r in runs}
    return {"virtual", "wall"} <= clocks


@dataclass(frozen=True)
class Row:
    label: str
    values: list[float]
    spec: str  # format of a value
    error: str  # how the simulated run's error is given: "relative" | "difference"
    scale: float = 1.0  # shown value = value * scale (shares in %)


def rows(figures: list[ClockFigures]) -> list[Row]:
    """The table's rows, runs in columns."""
    out = [
        Row("throughput (tokens / clock s)", [f.throughput for f in figures], ".4g", "relative"),
        Row("staleness mean (steps)", [f.staleness_mean for f in figures], ".2f", "relative"),
        Row("staleness p90 (steps)", [f.staleness_p90 for f in figures], ".0f", "difference"),
        Row("staleness max (steps)", [f.staleness_max for f in figures], ".0f", "difference"),
        Row("learner idle (%)", [f.learner_idle for f in figures], ".1f", "difference", 100.0),
    ]
    samplers = sorted({n for f in figures for n in f.sampler_share})
    for n in samplers:
        share = [f.sampler_share.get(n, math.nan) for f in figures]
        out.append(Row(f"{n}: share of trained groups (%)", share, ".1f", "difference", 100.0))
        stale = [f.sampler_staleness.get(n, math.nan) for f in figures]
        out.append(Row(f"{n}: staleness mean (steps)", stale, ".2f", "relative"))
    return out


def _fmt(value: float, spec: str) -> str:
    return "n/a" if not math.isfinite(value) else format(value, spec)


def live_spread(row: Row, figures: list[ClockFigures]) -> tuple[float, float]:
    """Mean and sample std (0 for one run) of the live runs' values."""
    live = [v * row.scale for v, f in zip(row.values, figures, strict=True) if not f.simulated and math.isfinite(v)]
    if not live:
        return math.nan, math.nan
    return statistics.fmean(live), statistics.stdev(live) if len(live) > 1 else 0.0


def prediction_error(row: Row, figures: list[ClockFigures]) -> str:
    """The one simulated run's value against the live runs' mean: `+12.3%` (relative) or `+1.0` (difference)."""
    sims = [v * row.scale for v, f in zip(row.values, figures, strict=True) if f.simulated]
    live_mean, _ = live_spread(row, figures)
    if len(sims) != 1 or not math.isfinite(sims[0]) or not math.isfinite(live_mean):
        return "n/a"
    if row.error == "relative":
        return "n/a" if live_mean == 0 else f"{(sims[0] - live_mean) / live_mean * 100:+.1f}%"
    return f"{sims[0] - live_mean:+.1f}"


def cells(figures: list[ClockFigures]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the comparison: a row per figure, a column per run, then the live runs' mean ± std (with
    several) and the simulated run's error (with exactly one)."""
    n_live = sum(not f.simulated for f in figures)
    one_sim = sum(f.simulated for f in figures) == 1
    header = ["", *(f.name for f in figures)]
    if n_live > 1:
        header.append(f"live mean ± std (n={n_live})")
    if one_sim:
        header.append("simulated − live")
    out = []
    for row in rows(figures):
        line = [row.label, *(_fmt(v * row.scale, row.spec) for v in row.values)]
        if n_live > 1:
            mean, std = live_spread(row, figures)
            line.append(f"{_fmt(mean, row.spec)} ± {_fmt(std, row.spec)}")
        if one_sim:
            line.append(prediction_error(row, figures))
        out.append(line)
    return header, out


def table(figures: list[ClockFigures]) -> list[str]:
    """The comparison as a markdown table."""
    header, body = cells(figures)
    return ["| " + " | ".join(r) + " |" for r in [header, ["---"] * len(header), *body]]


def to_json(figures: list[ClockFigures]) -> list[dict[str, Any]]:
    return [
        {
            "run": f.name,
            "clock": f.clock,
            "throughput": f.throughput,
            "staleness_mean": f.staleness_mean,
            "staleness_p90": f.staleness_p90,
            "staleness_max": f.staleness_max,
            "learner_idle": f.learner_idle,
            "staleness_histogram": {str(k): v for k, v in sorted(f.histogram.items())},
            "sampler_share": f.sampler_share,
            "sampler_staleness": f.sampler_staleness,
        }
        for f in figures
    ]


NOTES = """\
- *throughput*: tokens of the groups the learner accepted per second of the run's clock (virtual in the simulator,
  wall in a live cluster). *staleness*: of the trained groups (learner version at use − oldest token version),
  from summary.json's histogram; p90 is the smallest staleness that 90% of trained groups do not exceed.
  *learner idle*: share of clock time the learner was not training. Per sampler: its share of all trained groups
  and their mean staleness (summary.json `per_sampler`).
- *simulated − live*: the simulated run against the live runs' mean, relative (%) for throughput and mean
  staleness, in steps for p90 and max, in points for percentages.
"""
