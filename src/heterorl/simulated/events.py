"""A deterministic discrete-event scheduler with a virtual clock, and the `Clock` components read time from.

The simulated cluster runs the real computations (generation, training, encoding) but models time: each
component schedules "this finishes at t" as an event, and the loop jumps from event to event. Nothing here knows
about samplers or learners.

Determinism: events run in order of (time, sequence number), where the sequence number counts `schedule` calls.
Ties in time therefore run first-in first-out, and the same schedule calls give the same run, bit for bit.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Where components read the time (seconds, float); they never ask which kind of clock it is."""

    def now(self) -> float: ...


@dataclass(order=True)
class EventHandle:
    """A scheduled callback. Ordered by (time, seq); `cancel()` stops it from running."""

    time: float
    seq: int
    callback: Callable[..., Any] = field(compare=False, repr=False)
    args: tuple[Any, ...] = field(compare=False, repr=False)
    label: str = field(default="", compare=False)
    cancelled: bool = field(default=False, compare=False)
    done: bool = field(default=False, compare=False)

    def cancel(self) -> bool:
        """Cancel the event; returns False when it already ran or was already cancelled."""
        if self.done or self.cancelled:
            return False
        self.cancelled = True
        return True


class EventLoop:
    """Runs callbacks in virtual time.

    `schedule(at, cb, *args)` queues `cb(*args)` for time `at`; `step()` pops the earliest live event, sets `now`
    to its time and runs it. Callbacks may schedule further events (at `now` or later). Time never goes
    backwards: scheduling before `now` is an error.
    """

    def __init__(self, start: float = 0.0) -> None:
        _check_time(start, "start")
        self._now = float(start)
        self._queue: list[EventHandle] = []
        self._seq = 0
        self.events_run = 0

    @property
    def now(self) -> float:
        """Current virtual time (seconds)."""
        return self._now

    @property
    def clock(self) -> VirtualClock:
        """A `Clock` view of this loop."""
        return VirtualClock(self)

    def schedule(self, at: float, callback: Callable[..., Any], *args: Any, label: str = "") -> EventHandle:
        """Queue `callback(*args)` to run at virtual time `at` (>= now)."""
        _check_time(at, "event time")
        if at < self._now:
            raise ValueError(f"cannot schedule {label or callback!r} at {at} in the past (now = {self._now})")
        handle = EventHandle(float(at), self._seq, callback, args, label)
        self._seq += 1
        heapq.heappush(self._queue, handle)
        return handle

    def schedule_in(self, delay: float, callback: Callable[..., Any], *args: Any, label: str = "") -> EventHandle:
        """Queue `callback(*args)` to run `delay` (>= 0) seconds from now."""
        _check_time(delay, "delay")
        if delay < 0.0:
            raise ValueError(f"negative delay {delay} for {label or callback!r}")
        return self.schedule(self._now + delay, callback, *args, label=label)

    def _drop_cancelled(self) -> None:
        # Cancellation is lazy: cancelled handles stay in the heap until they reach its top.
        while self._queue and self._queue[0].cancelled:
            heapq.heappop(self._queue)

    def peek(self) -> float | None:
        """Time of the next live event, or None when nothing is pending."""
        self._drop_cancelled()
        return self._queue[0].time if self._queue else None

    @property
    def pending(self) -> int:
        """Number of live (not cancelled) events queued."""
        return sum(not h.cancelled for h in self._queue)

    def step(self) -> bool:
        """Run the next live event; returns False (and does nothing) when none is pending."""
        self._drop_cancelled()
        if not self._queue:
            return False
        handle = heapq.heappop(self._queue)
        self._now = handle.time
        # Marked done before the call so a callback that cancels its own handle gets False.
        handle.done = True
        self.events_run += 1
        handle.callback(*handle.args)
        return True

    def run_until(self, until: float | Callable[[], bool] | None = None, *, max_events: int | None = None) -> int:
        """Run events and return how many ran.

        - `until` a time: run every event with time <= until, then advance `now` to `until` (also when the queue
          empties earlier), so a later `schedule_in` counts from there.
        - `until` a predicate: run until it returns True (checked before each event) or the queue is empty.
        - `until` None: run until the queue is empty.
        `max_events` bounds the number of events run in this call (a guard against self-feeding loops).
        """
        deadline: float | None = None
        predicate: Callable[[], bool] | None = None
        if callable(until):
            predicate = until
        elif until is not None:
            _check_time(until, "until")
            if until < self._now:
                raise ValueError(f"cannot run until {until}: now is already {self._now}")
            deadline = float(until)
        ran = 0
        while max_events is None or ran < max_events:
            if predicate is not None and predicate():
                break
            nxt = self.peek()
            if nxt is None or (deadline is not None and nxt > deadline):
                break
            self.step()
            ran += 1
        if deadline is not None:
            nxt = self.peek()
            if nxt is None or nxt > deadline:  # every event up to the deadline ran (not cut by max_events)
                self._now = deadline
        return ran

    def run(self, *, max_events: int | None = None) -> int:
        """Run until no event is pending; returns how many ran."""
        return self.run_until(None, max_events=max_events)


def _check_time(t: float, what: str) -> None:
    if not math.isfinite(t):
        raise ValueError(f"{what} must be finite, got {t}")


class VirtualClock:
    """`Clock` backed by an `EventLoop`: reads the loop's virtual time."""

    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop

    def now(self) -> float:
        return self.loop.now


class WallClock:
    """`Clock` on real time: seconds of `time.monotonic()` since the clock was created (so it starts near 0,
    like a fresh `EventLoop`). Monotonic, so wall-clock adjustments never make time go backwards."""

    def __init__(self) -> None:
        self._origin = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self._origin
