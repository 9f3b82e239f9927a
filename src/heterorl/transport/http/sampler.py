"""HTTP as a sampler's transport (`transport.base.SamplerSide`): each upload and each weight pull is a request of
its own, so several uploads and a long-poll for weights are in flight at once; answers come back as callbacks on
the sampler's asyncio loop."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from heterorl.loop.protocol import Reply, Upload
from heterorl.transport.base import Held
from heterorl.transport.http.client import LearnerClient
from heterorl.transport.in_flight import InFlight


class HttpSamplerSide:
    """A `LearnerClient` behind the callback interface; `failed` holds the first error that ends the sampler."""

    def __init__(self, client: LearnerClient, reports: Callable[[], tuple[float | None, int]]) -> None:
        self.client = client
        self.reports = reports  # (idle share, weight updates failed) sent with every pull
        self.requests = InFlight()
        self.failed = self.requests.failed

    @property
    def counts(self) -> Counter[str]:
        return Counter(self.client.counts)

    def exchange(self, upload: Upload, done: Callable[[Reply | None], None]) -> None:
        self.requests.run(self.client.exchange(upload), done)

    def pull(self, held: Callable[[], Held], wait_s: float, done: Callable[[Any], None]) -> None:
        idle, failed = self.reports()
        self.requests.run(self.client.pull(held(), wait_s, idle, failed), done)

    async def settle(self, timeout: float) -> None:
        await self.requests.settle(timeout)

    def close(self) -> None:
        self.requests.cancel()
