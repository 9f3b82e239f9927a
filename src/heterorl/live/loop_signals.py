"""Signals a live node handles on its asyncio loop (`loop.add_signal_handler`), for the learner and the sampler.

A handler installed so runs as one of the loop's callbacks, between two of its steps, never in the middle of one,
and the loop wakes for it whichever thread the kernel handed the signal to. On leaving, the handlers that were
there before are put back: asyncio's own removal leaves the defaults, which would drop a handler the command had
installed (the CLI's one-line Ctrl-C handling).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def loop_signals(handlers: Mapping[signal.Signals, Callable[[], None]]) -> Iterator[Callable[[], None]]:
    """`handlers` on the running loop (from the main thread) while inside. Yields `restore`, which puts the previous
    handlers back at once (a handler that wants a second signal to act as before calls it); leaving calls it too."""
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in handlers}
    installed: list[signal.Signals] = []

    def restore() -> None:
        while installed:
            sig = installed.pop()
            loop.remove_signal_handler(sig)
            if previous[sig] is not None:
                signal.signal(sig, previous[sig])

    try:
        for sig, handler in handlers.items():
            loop.add_signal_handler(sig, handler)
            installed.append(sig)
        yield restore
    finally:
        restore()
