"""The sampler's end of a store conversation: a reply is handed over as soon as it is read, and deleted in the
background (a DELETE is a round trip to the store; over a WAN link, awaiting it made every exchange one round trip
longer: benchmarks/wan_bench.py, three-links-store), with the replies read close together in one request."""

from __future__ import annotations

import asyncio
import io
import random
import threading

from heterorl.config import LiveConfig, StoreConfig
from heterorl.eventlog import EventLog
from heterorl.loop.protocol import Reply, Upload
from heterorl.transport.backoff import Backoff
from heterorl.transport.store.intake import reply_key
from heterorl.transport.store.objects import MemoryStore
from heterorl.transport.store.sampler import StoreSamplerSide
from heterorl.transport.wire import encode_reply


class HeldDeletes(MemoryStore):
    """A store whose deletes wait until `release` is set (a slow round trip to the store)."""

    def __init__(self) -> None:
        super().__init__()
        self.release, self.deleting = threading.Event(), threading.Event()

    def delete(self, key: str) -> None:
        self.deleting.set()
        if not self.release.wait(30):
            raise TimeoutError("the test never released the delete")
        super().delete(key)


def test_a_reply_is_handed_over_before_its_delete_and_deleted_after() -> None:
    objects = HeldDeletes()
    cfg = StoreConfig(first_poll_seconds=0.01, poll_seconds=0.05)
    backoff = Backoff(0.01, 0.05, random.Random(0))
    answer = Reply(seq=0, granted=2, version=3)

    async def scenario() -> tuple[list[Reply], bool]:
        side = StoreSamplerSide(
            objects, cfg, LiveConfig(), "s0", "b00t", backoff, EventLog(io.StringIO()), lambda p: p, lambda: (0.5, 0)
        )
        replies: list[Reply] = []
        side.exchange(Upload("s0", "b00t", 0, -1, wanted=2), replies.append)
        while not objects.list("up/"):  # the learner's part: answer the upload
            await asyncio.sleep(0.01)
        objects.put(reply_key("s0", "b00t", 0), encode_reply(answer))
        for _ in range(500):  # up to 5 s while the delete is held
            if replies:
                break
            await asyncio.sleep(0.01)
        early = list(replies)
        held = objects.list("down/") != []  # its delete waits for the batch, or for the store
        objects.release.set()
        await side.settle(10)
        side.close()
        return early, held

    early, held = asyncio.run(scenario())
    assert early == [answer]  # handed over ...
    assert held  # ... while its delete was still waiting
    assert objects.list("down/") == []  # and deleted after


class CountedDeletes(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    def delete_many(self, keys: list[str]) -> None:
        self.batches.append(sorted(keys))
        super().delete_many(keys)


def test_replies_read_close_together_are_deleted_with_their_uploads_in_one_request() -> None:
    objects = CountedDeletes()
    cfg = StoreConfig(first_poll_seconds=0.01, poll_seconds=0.05)
    backoff = Backoff(0.01, 0.05, random.Random(0))

    uploads: list[str] = []

    async def scenario() -> list[Reply]:
        side = StoreSamplerSide(
            objects, cfg, LiveConfig(), "s0", "b00t", backoff, EventLog(io.StringIO()), lambda p: p, lambda: (0.5, 0)
        )
        replies: list[Reply] = []
        for seq in range(3):
            side.exchange(Upload("s0", "b00t", seq, -1, wanted=2), replies.append)
        while len(objects.list("up/")) < 3:
            await asyncio.sleep(0.01)
        uploads.extend(o.key for o in objects.list("up/"))
        for seq in range(3):  # the learner answers the three uploads at once
            objects.put(reply_key("s0", "b00t", seq), encode_reply(Reply(seq=seq, granted=2, version=3)))
        await side.settle(10)
        side.close()
        return replies

    replies = asyncio.run(scenario())
    assert sorted(r.seq for r in replies) == [0, 1, 2]
    replies_read = [reply_key("s0", "b00t", seq) for seq in range(3)]
    assert objects.batches == [sorted(replies_read + uploads)]  # one request for the three and their uploads
    assert objects.list("down/") == objects.list("up/") == []
