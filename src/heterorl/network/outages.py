"""Outage windows: times when a link is down in both directions (a cut on a schedule).

A window is half-open, [start, end): at `start` the link goes down, at `end` it is back. Windows come from the
config (`link.outages`) and from a trace's `up: false` rows; `Outages` merges them and answers the questions a
transfer model or the WAN lab's router asks: is the link down at t, when is it back, does a cut fall inside an
interval.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from heterorl.config import Outage


class Outages:
    """Sorted, disjoint [start, end) windows (overlapping or touching ones are merged)."""

    def __init__(self, windows: Iterable[tuple[float, float]] = ()) -> None:
        merged: list[list[float]] = []
        for start, end in sorted(windows):
            assert 0.0 <= start < end, f"an outage needs 0 <= start < end, got {start}, {end}"
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.starts = [w[0] for w in merged]
        self.ends = [w[1] for w in merged]

    @classmethod
    def from_config(cls, outages: Iterable[Outage]) -> Outages:
        return cls((o.start, o.end) for o in outages)

    def union(self, other: Outages) -> Outages:
        """Both sets of windows, merged."""
        return Outages([*self.windows, *other.windows])

    @property
    def windows(self) -> list[tuple[float, float]]:
        return list(zip(self.starts, self.ends, strict=True))

    def __bool__(self) -> bool:
        return bool(self.starts)

    def _window_at(self, t: float) -> int | None:
        """Index of the window holding t, if any."""
        i = bisect.bisect_right(self.starts, t) - 1
        return i if i >= 0 and t < self.ends[i] else None

    def down(self, t: float) -> bool:
        """Is the link down at time t?"""
        return self._window_at(t) is not None

    def next_up(self, t: float) -> float:
        """The first time >= t at which the link is up (t itself when it is up)."""
        i = self._window_at(t)
        return t if i is None else self.ends[i]

    def first_cut(self, a: float, b: float) -> tuple[float, float] | None:
        """The first window that intersects [a, b], or None when the link stays up throughout."""
        i = self._window_at(a)
        if i is not None:
            return self.starts[i], self.ends[i]
        j = bisect.bisect_right(self.starts, a)
        if j < len(self.starts) and self.starts[j] <= b:
            return self.starts[j], self.ends[j]
        return None
