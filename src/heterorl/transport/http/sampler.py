"""HTTP as a sampler's transport (`transport.base.SamplerSide`): each upload and each weight pull is a request of
its own, so several uploads and a long-poll for weights are in flight at once; answers come back as callbacks on
the sampler's asyncio loop."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from heterorl.loop.protocol import Reply, Upload
from heterorl.transport.base import Held
from heterorl.transport.http.client import LearnerClient


class HttpSamplerSide:
    """A `LearnerClient` behind the callback interface; `failed` holds the first error that ends the sampler."""

    def __init__(self, client: LearnerClient, reports: Callable[[], tuple[float | None, int]]) -> None:
        self.client = client
        self.reports = reports  # (idle share, weight updates failed) sent with every pull
        self.tasks: set[asyncio.Task[Any]] = set()
        self.failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def counts(self) -> Counter[str]:
        return Counter(self.client.counts)

    def exchange(self, upload: Upload, done: Callable[[Reply | None], None]) -> None:
        self._run(self.client.exchange(upload), done)

    def pull(self, held: Callable[[], Held], wait_s: float, done: Callable[[Any], None]) -> None:
        idle, failed = self.reports()
        self._run(self.client.pull(held(), wait_s, idle, failed), done)

    def _run(self, work: Awaitable[Any], done: Callable[[Any], None]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)

        def finished(t: asyncio.Task[Any]) -> None:
            self.tasks.discard(t)
            if t.cancelled():
                return
            if t.exception() is not None:  # unreachable, refused credential, not a learner: the sampler stops
                if not self.failed.done():
                    self.failed.set_exception(t.exception())  # type: ignore[arg-type]
                return
            done(t.result())

        task.add_done_callback(finished)

    async def settle(self, timeout: float) -> None:
        """Let the requests in flight finish (their answers still count), at most `timeout` seconds."""
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=timeout)

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
