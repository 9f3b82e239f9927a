"""A deterministic discrete-event scheduler with a virtual clock, in which the simulated cluster runs.

The simulated cluster runs the real computations (generation, training, encoding) but models time: each
component schedules "this finishes at t" as an event, and the loop jumps from event to event. Nothing here knows
about samplers or learners.

Determinism: events run in order of (time, sequence number), where the sequence number counts `schedule` calls.
Ties in time therefore run first-in first-out, and the same schedule calls give the same run, bit for bit.

Deferred events (`schedule_deferred`) are queued at a lower bound of their time and learn their exact time only when
they reach the top of the queue (`resolve()`); a later time puts them back with their original sequence number.
The run is therefore the same as if the exact time had been known when they were scheduled, while the work that
fixes it (the simulated cluster: encoding the weight patch whose size sets an arrival) overlaps whatever runs
before that bound.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


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
    resolve: Callable[[], float] | None = field(default=None, compare=False, repr=False)  # deferred: exact time

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

    def schedule_deferred(
        self, at_least: float, resolve: Callable[[], float], callback: Callable[..., Any], *args: Any, label: str = ""
    ) -> EventHandle:
        """Queue `callback(*args)` for a time not known yet: no earlier than `at_least` (>= now), exactly `resolve()`,
        which is called once, when the event reaches the top of the queue, and must not return less than
        `at_least`. Ordering is that of an event scheduled now at the resolved time (module docstring)."""
        handle = self.schedule(at_least, callback, *args, label=label)
        handle.resolve = resolve
        return handle

    def _settle_top(self) -> None:
        """Make the top of the queue a live event with its exact time: drop cancelled handles (cancellation is lazy)
        and resolve deferred ones, putting back those that turn out later."""
        while self._queue:
            top = self._queue[0]
            if top.cancelled:
                heapq.heappop(self._queue)
                continue
            if top.resolve is None:
                return
            at, top.resolve = top.resolve(), None
            _check_time(at, "resolved event time")
            if at < top.time:
                raise ValueError(f"{top.label or top.callback!r} resolved to {at}, before its lower bound {top.time}")
            if at > top.time:  # the same handle (callers may hold it to cancel), later, with its sequence number
                heapq.heappop(self._queue)
                top.time = float(at)
                heapq.heappush(self._queue, top)

    def peek(self) -> float | None:
        """Time of the next live event, or None when nothing is pending (resolves a deferred event at the top)."""
        self._settle_top()
        return self._queue[0].time if self._queue else None

    @property
    def pending(self) -> int:
        """Number of live (not cancelled) events queued."""
        return sum(not h.cancelled for h in self._queue)

    def step(self) -> bool:
        """Run the next live event; returns False (and does nothing) when none is pending."""
        self._settle_top()
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
