"""Rollouts out, through a store: a sampler uploads each encoded group under its own prefix and learns the
learner's verdict from what the learner did with the object.

Key: `rollouts/<sampler>/<boot>/<n>-<digest>.grp`, n counting this process's uploads, digest the xxh3-128 of the
group's bytes as generated (the learner checks it: a torn or corrupted object is refused as `corrupt`). The
learner journals a group before it deletes its object, and writes `<key>.rejected` (its reason) before deleting a
group it refuses. So, listing its own prefix: object present = not consumed yet; object gone with a marker =
refused for that reason; object gone without one = the learner has it (accepted, or a duplicate of one it has).
The marker is read directly, not from the listing: a listing is not a snapshot, and one that runs while the
learner writes a marker and deletes the group may show neither.
This is the `RolloutSink` of transport/base.py: `send` returns once the group is stored, with a future that holds
the verdict. At most `max_pending_groups` unconsumed uploads at a time (the sampler stops generating beyond),
which is the store's backpressure, as 503 `busy` is HTTP's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

from heterorl.config import LiveConfig, StoreConfig
from heterorl.eventlog import EventLog
from heterorl.loop.intake import REJECTION_STATUS
from heterorl.transport.http.client import Backoff
from heterorl.transport.store.manifest import ROLLOUTS
from heterorl.transport.store.objects import ObjectMissing, ObjectStore, StoreUnavailable
from heterorl.transport.store.source import StoreUnreachableError

REJECTED = ".rejected"
MAX_MARKER_BYTES = 4096


class StoreRolloutSink:
    """A sampler's rollout groups into the store (see the module docstring); call `close` when done."""

    def __init__(
        self,
        objects: ObjectStore,
        cfg: StoreConfig,
        live: LiveConfig,
        name: str,
        boot: str,
        backoff: Backoff,
        events: EventLog,
    ) -> None:
        self.objects, self.cfg, self.live, self.events, self.backoff = objects, cfg, live, events, backoff
        self.prefix = f"{ROLLOUTS}{name}/{boot}/"
        self.max_in_flight = cfg.max_pending_groups
        self.pending: dict[str, asyncio.Future[str]] = {}
        self.counts: Counter[str] = Counter()
        self.sent = 0
        self._poller: asyncio.Task[None] | None = None

    async def send(self, payload: bytes, digest: str) -> asyncio.Future[str]:
        """Store one encoded group (retrying through outages); the future resolves to the learner's verdict."""
        key = f"{self.prefix}{self.sent:010d}-{digest}.grp"
        self.sent += 1
        await self._retry(f"put {key}", lambda: self.objects.put(key, payload))
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.pending[key] = future
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._receipts())
        return future

    async def _retry(self, what: str, call) -> object:
        began = time.monotonic()
        while True:
            try:
                result = await asyncio.to_thread(call)
            except StoreUnavailable as err:
                self.counts["outage"] += 1
                self.events.emit("store", fault="outage", detail=f"{what}: {err}"[:300])
                if time.monotonic() - began > self.live.patience_s:
                    raise StoreUnreachableError(f"{what}: no answer for {self.live.patience_s:.0f} s ({err})") from None
                await asyncio.sleep(self.backoff.next_delay())
                continue
            self.backoff.reset()
            return result

    async def _receipts(self) -> None:
        """Poll this sampler's prefix until every pending group has a verdict."""
        while self.pending:
            await asyncio.sleep(self.cfg.poll_seconds)
            try:
                listing = await self._retry(f"list {self.prefix}", lambda: self.objects.list(self.prefix))
            except StoreUnreachableError as err:
                for future in self.pending.values():
                    if not future.done():
                        future.set_exception(err)
                self.pending.clear()
                return
            present = {o.key for o in listing}  # type: ignore[attr-defined]
            for key, future in list(self.pending.items()):
                if key in present:
                    continue
                # read the marker directly even when the listing does not show it: a listing that ran while the
                # learner wrote the marker and deleted the group may show neither (listings are not snapshots)
                outcome = await self._marker(key + REJECTED) or "accepted"
                del self.pending[key]
                self.counts[outcome] += 1
                if not future.done():
                    future.set_result(outcome)

    async def _marker(self, key: str) -> str | None:
        """The reason in a `.rejected` marker (then deleted), None when there is none; unknown contents read as
        `malformed`."""
        try:
            raw = await self._retry(f"get {key}", lambda: self.objects.get(key, MAX_MARKER_BYTES))
        except ObjectMissing:
            return None
        try:
            outcome = json.loads(raw).get("outcome")  # type: ignore[arg-type]
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            outcome = None
        await self._retry(f"delete {key}", lambda: self.objects.delete(key))
        return outcome if outcome in REJECTION_STATUS else "malformed"

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
