"""HTTP as a `RolloutSink` (transport/base.py): one POST at a time, its answer is the verdict."""

from __future__ import annotations

import asyncio

from heterorl.transport.base import SamplerTransport
from heterorl.transport.http.client import LearnerClient


class HttpRolloutSink:
    """POSTs through a `LearnerClient`; `max_in_flight` 1 keeps the order in which groups reach the learner."""

    max_in_flight = 1

    def __init__(self, client: LearnerClient) -> None:
        self.client = client

    async def send(self, payload: bytes, digest: str) -> asyncio.Future[str]:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        future.set_result(await self.client.push(payload, digest))
        return future


def http_transport(client: LearnerClient) -> SamplerTransport:
    """Everything over HTTP: weights by long-poll, groups by POST, admission by POST."""
    return SamplerTransport(weights=client, rollouts=HttpRolloutSink(client), admission=client)
