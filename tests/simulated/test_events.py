"""EventLoop: time order, FIFO ties, cancellation, run_until, no scheduling into the past, determinism."""

from __future__ import annotations

import pytest

from heterorl.simulated.events import EventLoop


def test_events_run_in_time_order_and_advance_now():
    loop = EventLoop()
    seen: list[tuple[float, str]] = []
    for t, name in [(3.0, "c"), (1.0, "a"), (2.5, "b")]:
        loop.schedule(t, lambda n=name: seen.append((loop.now, n)))
    assert loop.run() == 3
    assert seen == [(1.0, "a"), (2.5, "b"), (3.0, "c")]
    assert loop.now == 3.0
    assert loop.events_run == 3


def test_ties_run_fifo_including_events_scheduled_by_callbacks():
    loop = EventLoop()
    order: list[str] = []

    def first() -> None:
        order.append("first")
        loop.schedule_in(0.0, order.append, "spawned-at-1")  # same time, queued after "second"

    loop.schedule(1.0, first)
    loop.schedule(1.0, order.append, "second")
    loop.schedule(0.5, order.append, "early")
    loop.run()
    assert order == ["early", "first", "second", "spawned-at-1"]


def test_cancel_skips_event_and_reports_state():
    loop = EventLoop()
    order: list[str] = []
    h = loop.schedule(1.0, order.append, "cancelled", label="x")
    loop.schedule(2.0, order.append, "kept")
    assert loop.pending == 2
    assert h.cancel() is True
    assert h.cancel() is False  # second cancel is a no-op
    assert loop.pending == 1
    assert loop.peek() == 2.0
    loop.run()
    assert order == ["kept"]
    ran = loop.schedule_in(1.0, order.append, "done")
    loop.run()
    assert ran.done
    assert ran.cancel() is False  # too late


def test_step_returns_false_when_empty():
    loop = EventLoop()
    assert loop.step() is False
    assert loop.peek() is None
    loop.schedule(4.0, lambda: None)
    assert loop.step() is True
    assert loop.now == 4.0
    assert loop.step() is False


def test_run_until_time_runs_inclusive_and_advances_clock():
    loop = EventLoop()
    order: list[float] = []
    for t in (1.0, 2.0, 3.0):
        loop.schedule(t, lambda: order.append(loop.now))
    assert loop.run_until(2.0) == 2
    assert order == [1.0, 2.0]
    assert loop.now == 2.0
    assert loop.run_until(2.5) == 0
    assert loop.now == 2.5  # the clock moves to the deadline even without events
    loop.schedule_in(0.25, lambda: order.append(loop.now))
    loop.run_until(10.0)
    assert order == [1.0, 2.0, 2.75, 3.0]
    assert loop.now == 10.0


def test_run_until_predicate_and_max_events():
    loop = EventLoop()
    count = [0]

    def tick() -> None:  # a self-feeding process: one tick per second forever
        count[0] += 1
        loop.schedule_in(1.0, tick)

    loop.schedule(0.0, tick)
    assert loop.run_until(lambda: count[0] >= 5) == 5
    assert loop.now == 4.0
    assert loop.run(max_events=3) == 3
    assert count[0] == 8
    # max_events cuts a time-bounded run short: the clock stays at the last event, not the deadline.
    assert loop.run_until(100.0, max_events=2) == 2
    assert loop.now == 9.0


def test_scheduling_into_the_past_raises():
    loop = EventLoop()
    loop.schedule(5.0, lambda: None)
    loop.run()
    with pytest.raises(ValueError, match="past"):
        loop.schedule(4.999, lambda: None)
    with pytest.raises(ValueError, match="negative"):
        loop.schedule_in(-1.0, lambda: None)
    with pytest.raises(ValueError, match="already"):
        loop.run_until(1.0)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            loop.schedule(bad, lambda: None)
    loop.schedule(5.0, lambda: None)  # exactly now is fine


def _trace(seed_order: list[tuple[float, str]]) -> list[tuple[float, int, str]]:
    loop = EventLoop()
    trace: list[tuple[float, int, str]] = []

    def fire(name: str, depth: int) -> None:
        trace.append((loop.now, loop.events_run, name))
        if depth < 3:
            loop.schedule_in(0.5 * depth, fire, f"{name}.{depth}", depth + 1)
            loop.schedule_in(0.5 * depth, fire, f"{name}.{depth}b", depth + 1)

    for t, name in seed_order:
        loop.schedule(t, fire, name, 0)
    loop.run()
    return trace


def test_same_schedule_gives_identical_trace():
    seeds = [(1.0, "a"), (1.0, "b"), (0.0, "c"), (2.0, "d")]
    first = _trace(seeds)
    assert first == _trace(seeds)
    assert len(first) == 4 * (1 + 2 + 4 + 8)
    times = [t for t, _, _ in first]
    assert times == sorted(times)


def test_a_deferred_event_runs_as_if_scheduled_at_its_resolved_time_with_its_sequence():
    """A deferred event learns its time at the top of the queue; ties with it still break by scheduling order."""
    loop = EventLoop()
    order: list[tuple[float, str]] = []
    resolved: list[str] = []

    def exact() -> float:
        resolved.append("deferred")
        return 5.0

    loop.schedule_deferred(2.0, exact, lambda: order.append((loop.now, "deferred")))
    loop.schedule(5.0, lambda: order.append((loop.now, "later tie")))  # scheduled after it: runs after it
    loop.schedule(3.0, lambda: order.append((loop.now, "between")))
    loop.schedule(1.0, lambda: order.append((loop.now, "before")))
    assert loop.peek() == 1.0
    assert resolved == []
    assert loop.run() == 4
    assert order == [(1.0, "before"), (3.0, "between"), (5.0, "deferred"), (5.0, "later tie")]
    assert resolved == ["deferred"]


def test_a_deferred_event_respects_run_until_deadlines_and_bounds():
    loop = EventLoop()
    seen: list[float] = []
    loop.schedule_deferred(1.0, lambda: 7.0, lambda: seen.append(loop.now))
    loop.run_until(5.0)
    assert seen == []
    assert loop.now == 5.0
    loop.run()
    assert seen == [7.0]
    loop.schedule_deferred(8.0, lambda: 7.5, lambda: None, label="early")
    with pytest.raises(ValueError, match="before its lower bound"):
        loop.run()
