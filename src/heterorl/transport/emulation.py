"""Link emulation in the application (`live.emulate_links`): a live sampler side whose messages wait their node's
link delays and bandwidth and suffer its faults, from the same seeded streams as the simulated link
(`heterorl.network.Link`).

An upload waits its up-path delay before it is sent and its reply the down-path delay before it is handed over;
a weight update waits the down-path delay plus its bandwidth term. A dropped upload is never sent: the sampler
hears nothing and sends it again after `Liveness.timeout()` (as over a real lossy link); a duplicated one is sent
twice; a corrupted one has a byte of one group flipped (the learner refuses that group as `corrupt`). A dropped
weight update is never applied (the next pull asks again), a corrupted one has a byte flipped (refused by the
receiver, which then asks for a snapshot).

This paces and perturbs a live run for tests and experiments; it does not model TCP. For real shaping of the
processes' TCP connections use the WAN lab (docs/deployment.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from heterorl.config import LinkConfig, LiveConfig
from heterorl.loop.protocol import Reply, Upload
from heterorl.network import Link, bandwidth_seconds
from heterorl.transport.backoff import Liveness
from heterorl.transport.base import Held


class EmulatedSide:
    """A live sampler side behind an emulated link (see the module docstring)."""

    def __init__(self, inner: Any, cfg: LinkConfig, seed: int, index: int, live: LiveConfig) -> None:
        self.inner, self.link = inner, Link(cfg, seed=seed, index=index)
        self.liveness = Liveness(live.dead_after_s)
        self.failed = inner.failed
        self.tasks: set[asyncio.Task[Any]] = set()
        self.faults: Counter[str] = Counter()

    @property
    def counts(self) -> Counter[str]:
        return Counter(self.inner.counts) + Counter({f"emulated_{k}": v for k, v in self.faults.items()})

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def exchange(self, upload: Upload, done: Callable[[Reply | None], None]) -> None:
        self._spawn(self._exchange(upload, done))

    async def _exchange(self, upload: Upload, done: Callable[[Reply | None], None]) -> None:
        nbytes = sum(len(g) for g in upload.groups) + 256
        while True:
            began = time.monotonic()
            deliveries = self.link.transmit("rollout", b"\0", 0.0)  # draws the path's delay and fault streams
            wait = deliveries[0].at if deliveries else 0.0
            await asyncio.sleep(wait + bandwidth_seconds(nbytes, self.link.cfg.bandwidth_mbps))
            if not deliveries:  # lost on the way: the learner never sees it, the sampler's timeout retries
                self.faults["drop"] += 1
                await asyncio.sleep(self.liveness.timeout())
                continue
            sent = self._corrupt(upload) if deliveries[0].corrupted else upload
            reply = await self._call(sent)
            if len(deliveries) > 1:  # duplicated: the learner sees it twice (the second answer is ignored)
                self.faults["duplicate"] += 1
                await self._call(sent)
            back = self.link.transfer_seconds("weights", 256)
            await asyncio.sleep(back)
            self.liveness.answered(time.monotonic() - began, time.monotonic())
            done(reply)
            return

    def _corrupt(self, upload: Upload) -> Upload:
        """One byte of the first group flipped (the learner's digest check refuses it as `corrupt`)."""
        self.faults["corrupt"] += 1
        if not upload.groups:
            return upload
        first = bytearray(upload.groups[0])
        first[len(first) // 2] ^= 0xFF
        return dataclasses.replace(upload, groups=(bytes(first), *upload.groups[1:]))

    async def _call(self, upload: Upload) -> Reply | None:
        future: asyncio.Future[Reply | None] = asyncio.get_running_loop().create_future()
        self.inner.exchange(upload, lambda r: future.done() or future.set_result(r))
        return await future

    def pull(self, held: Callable[[], Held], wait_s: float, done: Callable[[Any], None]) -> None:
        def arrived(result: Any) -> None:
            self._spawn(self._after_pull(result, done))

        self.inner.pull(held, wait_s, arrived)

    async def _after_pull(self, result: Any, done: Callable[[Any], None]) -> None:
        if not isinstance(result, bytes):
            done(result)
            return
        deliveries = self.link.transmit("weights", result, 0.0)
        if not deliveries:
            self.faults["drop"] += 1
            await asyncio.sleep(self.link.delays["weights"].sample(self.link.delay_rngs["weights"]))
            done(None)  # lost: the node asks again
            return
        first = deliveries[0]
        await asyncio.sleep(first.at)
        self.faults["corrupt"] += first.corrupted
        done(first.payload)

    async def settle(self, timeout: float) -> None:
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=timeout)
        await self.inner.settle(timeout)

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.inner.close()
