"""call_with_deadline: interrupts Python loops in any thread, leaves nothing behind, keeps outer alarms."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from heterorl.tasks.deadline import DeadlineExceeded, call_with_deadline


def spin(seconds: float) -> str:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "finished"


def test_returns_the_result_in_time() -> None:
    assert call_with_deadline(lambda: 6 * 7, 1.0) == 42


def test_interrupts_a_python_loop_in_the_main_thread() -> None:
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        call_with_deadline(lambda: spin(10.0), 0.05)
    assert time.monotonic() - start < 2.0


def test_interrupts_a_python_loop_in_a_worker_thread() -> None:
    outcome: list[str] = []

    def work() -> None:
        try:
            outcome.append(call_with_deadline(lambda: spin(10.0), 0.05))
        except DeadlineExceeded:
            outcome.append("deadline")

    t = threading.Thread(target=work)
    t.start()
    t.join(5.0)
    assert outcome == ["deadline"]


def test_a_finished_call_leaves_no_pending_exception() -> None:
    for _ in range(50):
        assert call_with_deadline(lambda: 1, 0.01) == 1
    assert spin(0.1) == "finished"  # past every deadline above: nothing fires late


def test_a_result_after_the_deadline_counts_as_exceeded() -> None:
    with pytest.raises(DeadlineExceeded):
        call_with_deadline(lambda: time.sleep(0.2), 0.02)  # one C call: interrupted only when it returns


def test_an_outer_alarm_timer_is_left_running() -> None:
    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        call_with_deadline(lambda: 1, 1.0)
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert remaining > 90.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
