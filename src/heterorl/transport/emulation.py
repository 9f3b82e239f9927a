"""Link emulation for live transports: a node's `LinkConfig` applied to real messages.

With `live.emulate_links` a sampler sleeps for the link's delay model and bandwidth term (before sending a group,
after receiving weights), and the fault injector drops, duplicates, delays (reorder) or corrupts (one byte
flipped) messages, from the same seeded streams as the simulated link (`heterorl.network.Link`).
"""

from __future__ import annotations

import asyncio
import time

from heterorl.config import LinkConfig
from heterorl.network import Link, LinkPath


class LinkEmulator:
    """A node's link applied to real messages (delays as sleeps, faults as drops/copies/flipped bytes)."""

    def __init__(self, cfg: LinkConfig | None, seed: int, index: int) -> None:
        self.link = None if cfg is None else Link(cfg, seed=seed, index=index)

    async def _transmit(self, path: LinkPath, payload: bytes) -> list[bytes]:
        if self.link is None:
            return [payload]
        start = time.monotonic()
        out = []
        for delivery in sorted(self.link.transmit(path, payload, 0.0), key=lambda d: d.at):
            await asyncio.sleep(max(0.0, start + delivery.at - time.monotonic()))
            out.append(delivery.payload)
        return out

    async def outbound(self, payload: bytes) -> list[bytes]:
        """A group on its way to the learner: [] (dropped), [payload], or two copies; after the delay."""
        return await self._transmit("rollout", payload)

    async def inbound(self, payload: bytes) -> list[bytes]:
        """A weight update that has arrived: what the sampler gets to apply, after the delay."""
        return await self._transmit("weights", payload)
