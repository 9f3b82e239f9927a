"""Link traces: a measured network replayed over time by the simulator and by the WAN lab.

A trace is one file per link, JSON lines (`.jsonl`: one object per line) or CSV (`.csv`: a header, then rows),
with a time column `t` (seconds from the run's start, never decreasing) and any of these columns:

    weights_delay_s, rollout_delay_s   one-way delay of each direction (s): learner -> sampler, sampler -> learner
    weights_mbps, rollout_mbps         rate of each direction (Mbit/s, > 0)
    weights_loss, rollout_loss         packet loss probability of each direction (0 .. 0.5)
    up                                 link state: false (or 0) = cut, true (or 1) = up

Each value holds from its row's `t` until the next row that gives the same column (a step function; a missing
JSON key or an empty CSV cell gives nothing). Before a column's first row and for columns the trace never gives,
the link's config applies; after the last row, the last values hold. Example (JSON lines):

    {"t": 0, "weights_delay_s": 0.05, "rollout_delay_s": 0.05, "weights_mbps": 100, "rollout_mbps": 20}
    {"t": 0.1, "weights_delay_s": 0.07}
    {"t": 30, "up": false}
    {"t": 45, "up": true}
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from heterorl.errors import DataError
from heterorl.network.outages import Outages

MAX_ROWS = 5_000_000
_BOUNDS: dict[str, tuple[float, float, bool]] = {  # column -> (low, high, low is exclusive)
    "weights_delay_s": (0.0, 86_400.0, False),
    "rollout_delay_s": (0.0, 86_400.0, False),
    "weights_mbps": (0.0, 1e6, True),
    "rollout_mbps": (0.0, 1e6, True),
    "weights_loss": (0.0, 0.5, False),
    "rollout_loss": (0.0, 0.5, False),
    "up": (0.0, 1.0, False),
}
COLUMNS = ("t", *_BOUNDS)


class TraceError(DataError):
    """A trace file is missing or malformed; the message names the file, the line and the column (a setup
    mistake: the CLI prints it as one line)."""


@dataclass(frozen=True)
class Series:
    """A step function: value[i] holds on [times[i], times[i + 1])."""

    times: np.ndarray
    values: np.ndarray

    def at(self, t: float) -> float | None:
        """The value at time t, or None before the first row."""
        i = int(np.searchsorted(self.times, t, side="right")) - 1
        return None if i < 0 else float(self.values[i])

    def time_weighted_quantiles(self, probabilities: list[float], until: float) -> np.ndarray:
        """Quantiles of the value seen at a uniformly random time in [times[0], until): each value weighs the
        time it holds (what a probe sent at random times measures)."""
        ends = np.append(self.times[1:], until).clip(max=until)
        weights = np.clip(ends - self.times, 0.0, None)
        order = np.argsort(self.values, kind="stable")
        cum = np.cumsum(weights[order])
        assert cum[-1] > 0.0, "the trace spans no time before `until`"
        idx = np.searchsorted(cum / cum[-1], probabilities, side="left")
        return self.values[order][np.minimum(idx, len(order) - 1)]


class LinkTrace:
    """A parsed trace: one `Series` per column it gives, and its cuts as `Outages`."""

    def __init__(self, series: dict[str, Series], source: str = "<trace>") -> None:
        self.series = series
        self.source = source
        self.outages = _cuts(series.get("up"))

    def value(self, column: str, t: float) -> float | None:
        """The column's value at time t, or None when the config applies."""
        s = self.series.get(column)
        return None if s is None else s.at(t)

    def delay(self, path: Literal["weights", "rollout"], t: float) -> float | None:
        return self.value(f"{path}_delay_s", t)

    def rate_mbps(self, path: Literal["weights", "rollout"], t: float) -> float | None:
        return self.value(f"{path}_mbps", t)

    def loss(self, path: Literal["weights", "rollout"], t: float) -> float | None:
        return self.value(f"{path}_loss", t)

    @property
    def end(self) -> float:
        """Time of the last row."""
        return max((float(s.times[-1]) for s in self.series.values()), default=0.0)


def _cuts(up: Series | None) -> Outages:
    """Windows where `up` is 0; a cut that is never lifted lasts forever."""
    if up is None:
        return Outages()
    windows, start = [], None
    for t, v in zip(up.times, up.values, strict=True):
        if v == 0.0 and start is None:
            start = float(t)
        elif v != 0.0 and start is not None:
            if t > start:
                windows.append((start, float(t)))
            start = None
    if start is not None:
        windows.append((start, float("inf")))
    return Outages(windows)


def _number(raw: object, column: str, where: str) -> float:
    if column == "up" and isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        raw = raw.strip().lower() == "true"
    if isinstance(raw, bool):
        if column != "up":
            raise TraceError(f"{where}: {column} must be a number, got {raw!r}")
        return float(raw)
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {column} must be a number, got {raw!r}") from None
    if column == "t":
        if not 0.0 <= value < float("inf"):
            raise TraceError(f"{where}: t must be >= 0 and finite, got {value}")
        return value
    if column == "up" and value not in (0.0, 1.0):
        raise TraceError(f"{where}: up must be true/false or 1/0, got {raw!r}")
    low, high, open_low = _BOUNDS[column]
    if not (low < value if open_low else low <= value) or not value <= high:
        raise TraceError(f"{where}: {column} = {value} is outside {'(' if open_low else '['}{low}, {high}]")
    return value


def parse_rows(rows: list[tuple[int, dict[str, object]]], source: str) -> LinkTrace:
    """Rows (line number, column -> raw value; None or "" = not given) -> a `LinkTrace`."""
    if not rows:
        raise TraceError(f"{source}: the trace has no rows")
    if len(rows) > MAX_ROWS:
        raise TraceError(f"{source}: {len(rows)} rows, more than {MAX_ROWS}")
    points: dict[str, tuple[list[float], list[float]]] = {}
    last_t = 0.0
    for line, row in rows:
        where = f"{source}:{line}"
        unknown = sorted(set(row) - set(COLUMNS))
        if unknown:
            raise TraceError(f"{where}: unknown column {unknown[0]!r}; known: {', '.join(COLUMNS)}")
        if row.get("t") in (None, ""):
            raise TraceError(f"{where}: every row needs a time `t`")
        t = _number(row["t"], "t", where)
        if t < last_t:
            raise TraceError(f"{where}: t = {t} goes back in time (previous row: {last_t})")
        last_t = t
        for column, raw in row.items():
            if column == "t" or raw is None or raw == "":
                continue
            times, values = points.setdefault(column, ([], []))
            times.append(t)
            values.append(_number(raw, column, where))
    series = {c: Series(np.asarray(ts), np.asarray(vs)) for c, (ts, vs) in points.items()}
    return LinkTrace(series, source)


def parse_trace(text: str, fmt: Literal["jsonl", "csv"], source: str = "<trace>") -> LinkTrace:
    """A trace from its text (see the module docstring for the format)."""
    rows: list[tuple[int, dict[str, object]]] = []
    if fmt == "jsonl":
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{source}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise TraceError(f"{source}:{number}: each line must be a JSON object")
            rows.append((number, row))
    else:
        reader = csv.DictReader(io.StringIO(text))
        for row in reader:
            if None in row:
                raise TraceError(f"{source}:{reader.line_num}: more cells than the header has columns")
            rows.append((reader.line_num, {k.strip(): (v or "").strip() for k, v in row.items()}))
    return parse_rows(rows, source)


def read_trace(path: str | Path) -> LinkTrace:
    """Read a trace file; the format follows the extension (.jsonl / .json lines, or .csv)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".jsonl", ".csv"):
        raise TraceError(f"{p}: a trace must be a .jsonl or .csv file")
    try:
        text = p.read_text()
    except OSError as exc:
        raise TraceError(f"{p}: cannot read the trace ({exc.strerror})") from None
    return parse_trace(text, "jsonl" if suffix == ".jsonl" else "csv", str(p))
