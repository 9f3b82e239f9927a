"""The requests a live sampler side has on their way (HTTP, the store, the link emulation): each runs as an
asyncio task whose result is handed to a callback; the first error fails `failed` (the sampler stops on it);
`settle` lets the answers already on their way arrive; `cancel` drops the rest; `close` drops them, waits until they
are gone and refuses new work (a sampler stopped by a signal: a request started by an answer that came in while
asyncio cancelled the tasks it knew of was left pending, and Python printed "Task was destroyed but it is pending!"
below the sampler's one line)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class InFlight:
    """Tasks in flight and the future their first error fails (see the module docstring)."""

    def __init__(self, failed: asyncio.Future[None] | None = None) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self.failed = failed if failed is not None else asyncio.get_running_loop().create_future()
        self.closed = False

    def run(self, work: Awaitable[Any], done: Callable[[Any], None]) -> None:
        """Run `work`; hand its result to `done`, or its error to `failed` (unreachable, a refused credential,
        not a learner: the sampler stops). Closed: `work` is not started."""
        if self.closed:
            close = getattr(work, "close", None)  # a coroutine never awaited would warn
            if close is not None:
                close()
            return
        task = asyncio.ensure_future(work)
        self.tasks.add(task)

        def finished(t: asyncio.Task[Any]) -> None:
            self.tasks.discard(t)
            if t.cancelled():
                return
            if t.exception() is not None:
                if not self.failed.done():
                    self.failed.set_exception(t.exception())  # type: ignore[arg-type]
                    # marked as seen: a side that is shutting down (interrupted, finished) never awaits it, and
                    # asyncio would then print "Future exception was never retrieved" and a traceback to the user
                    self.failed.exception()
                return
            done(t.result())

        task.add_done_callback(finished)

    async def settle(self, timeout: float) -> None:
        """Let the tasks in flight finish (their answers still count), and those they start meanwhile, at most
        `timeout` seconds."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.tasks:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            await asyncio.wait(set(self.tasks), timeout=left)

    def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()

    async def close(self, timeout: float = 5.0) -> None:
        """Refuse new work, cancel what is in flight and wait (at most `timeout` s) until it has ended."""
        self.closed = True
        self.cancel()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=timeout)
