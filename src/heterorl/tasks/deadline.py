"""Bound the run time of a Python call from any thread, without signals.

math-verify bounds its sympy work with `signal.alarm`, which (a) only works in the main thread and (b) replaces
any outer SIGALRM timer (pytest-timeout, a job supervisor) and cancels it on the way out. Samplers may score
from worker threads, so we disable its timeouts and use this instead: a timer thread raises `DeadlineExceeded` in
the calling thread through CPython's `PyThreadState_SetAsyncExc`. That interrupts pure-Python loops (sympy) at the
next bytecode boundary in any thread; like a signal handler, it cannot interrupt one long call into C, which then
ends first.

`DeadlineExceeded` derives from BaseException so that libraries' `except Exception` blocks (math-verify wraps most
of its work in them) do not swallow it.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class DeadlineExceeded(BaseException):
    """Raised inside a call that ran past its deadline."""


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> int:
    """Schedule `exc` in thread `thread_id` (None clears a pending one); returns the number of threads touched."""
    arg = ctypes.py_object(exc) if exc is not None else None  # None -> NULL pointer -> clear
    return ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), arg)


def call_with_deadline(fn: Callable[[], T], seconds: float) -> T:
    """`fn()`, or `DeadlineExceeded` once `seconds` have passed (checked at bytecode boundaries).

    A result that arrives after the deadline fired is also reported as `DeadlineExceeded`, so the outcome does
    not depend on when the asynchronous exception happened to be delivered.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}")
    caller = threading.get_ident()
    lock = threading.Lock()
    state = {"done": False, "fired": False}

    def fire() -> None:
        with lock:  # never fire once the caller has finished: the exception would land in unrelated code
            if not state["done"]:
                state["fired"] = True
                touched = _set_async_exc(caller, DeadlineExceeded)
                assert touched == 1, f"PyThreadState_SetAsyncExc touched {touched} threads"

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        result = fn()
    finally:
        with lock:
            state["done"] = True
            if state["fired"]:
                _set_async_exc(caller, None)  # drop the exception if it has not been delivered yet
        timer.cancel()
    if state["fired"]:
        raise DeadlineExceeded(f"call finished after its {seconds:g} s deadline")
    return result
