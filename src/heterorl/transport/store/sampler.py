"""A store as a sampler's transport (`transport.base.SamplerSide`): uploads and replies as objects, weights from the
manifest (`StoreWeightSource`).

An upload is written under `up/<sampler>/<session>/<seq>-<digest>.up` (`intake.upload_key`; the learner checks
the digest: a torn or corrupted object is refused as `corrupt`); its reply appears under
`down/<sampler>/<session>/<seq>.reply`, which the sampler looks for at a `Cadence`: at once, then every
`first_poll_seconds` (start to start: over a long link the next look goes as the "not there" comes back) for
`busy_poll_seconds` (the reply is due), then at spacings doubling to `poll_seconds`. (Looks
sent on time without waiting for the previous answer saw replies sooner but tripled the GETs, and on the WAN lab's
2-core machine the store server they loaded slowed the learner's listings more than they gained.) The reply is
handed over as soon as it is read; it and its upload (which the learner leaves to the sampler: a request fewer) are
deleted in the background (a DELETE is a round trip to the store: over a WAN link awaiting it made every exchange
one round trip longer), with the other objects done with within `DELETE_BATCH_S` in one request
(`ObjectStore.delete_many`: S3's DeleteObjects; every request costs the store and both ends CPU, which in the
one-machine WAN lab all share the learner's cores). With the learner's public key a reply must be
signed by the learner for this upload (`identity.open_reply`): one that is not is counted (`forged_reply`),
deleted, and the upload is written again under a key of its own (`upload_key`'s `attempt`), which the learner
answers anew (from its retry cache, or `duplicate`
after a restart: a group is never taken twice); at the forged reply after `MAX_FORGED_REPLIES` such rewrites the
upload is given up as refused.
Several uploads are in flight at once, each with its own reply to wait for. Store calls block (s3fs runs them on
its own event loop): they run in a thread pool of this side's own, `IO_THREADS` wide, so that the uploads in flight,
their background DELETEs and the weights' polls never queue behind each other in asyncio's default executor (as
many threads as cores + 4: six on a 2-core machine, fewer than one sampler's requests in flight). Store outages
are retried with backoff; a store silent for `live.patience_s` raises `StoreUnreachableError`, which ends the
sampler.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from heterorl.config import LiveConfig, StoreConfig
from heterorl.eventlog import EventLog
from heterorl.loop.protocol import Reply, Upload
from heterorl.transport.backoff import Backoff
from heterorl.transport.base import Held
from heterorl.transport.identity import open_reply, sign_upload
from heterorl.transport.in_flight import InFlight
from heterorl.transport.store.cadence import Cadence
from heterorl.transport.store.intake import reply_key, upload_key
from heterorl.transport.store.objects import ObjectMissing, ObjectStore, StoreUnavailable
from heterorl.transport.store.source import StoreUnreachableError, StoreWeightSource
from heterorl.transport.wire import WireError, decode_reply, encode_upload
from heterorl.weights.signing import Authority

MAX_REPLY_BYTES = 1 << 20
IO_THREADS = 32
DELETE_BATCH_S = 0.25  # objects done with within this long go in one delete request
MAX_FORGED_REPLIES = 3  # an upload written again this often after forged replies; the next forgery gives it up


class StoreSamplerSide:
    """One sampler's end of the store (see the module docstring); `close` when done."""

    def __init__(
        self,
        objects: ObjectStore,
        cfg: StoreConfig,
        live: LiveConfig,
        name: str,
        session: str,
        backoff: Backoff,
        events: EventLog,
        merge: Callable[[list[bytes]], bytes],
        reports: Callable[[], tuple[float | None, int]],
        authority: Authority | None = None,
        signing_key: Ed25519PrivateKey | None = None,
        weights_objects: ObjectStore | None = None,
    ) -> None:
        self.objects, self.cfg, self.live, self.name, self.session = objects, cfg, live, name, session
        self.backoff, self.events, self.reports = backoff, events, reports
        self.signing_key = signing_key  # signs every upload (`transport.identity.sign_upload`) when set
        # weights through a client of their own (`weights_objects`): its connections carry updates only, so the
        # window one update grew carries the next, as the HTTP client's weight connection does
        weights_from = weights_objects if weights_objects is not None else objects
        self.pool = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="store-io")
        self.source = StoreWeightSource(
            weights_from, cfg, live, name, backoff, events, merge, session, authority, pool=self.pool
        )
        self.learner_key = None if authority is None else authority.key  # replies must be signed with it
        self.uploads: Counter[str] = Counter()
        self.requests = InFlight()
        self._done_with: list[str] = []  # replies read and their uploads, to delete in the next batch
        self._deleting = False
        self.failed = self.requests.failed

    @property
    def counts(self) -> Counter[str]:
        return self.source.counts + self.uploads

    # ------------------------------------------------------------------ SamplerSide
    def exchange(self, upload: Upload, done: Callable[[Reply | None], None]) -> None:
        self.requests.run(self._exchange(upload), done)

    def pull(self, held: Callable[[], Held], wait_s: float, done: Callable[[Any], None]) -> None:
        idle, failed = self.reports()
        version, state_hash = held()
        self.requests.run(self.source.pull(version, state_hash, wait_s, idle, failed), done)

    async def _exchange(self, upload: Upload) -> Reply:
        body = encode_upload(upload)
        if self.signing_key is not None:
            body = sign_upload(self.signing_key, self.name, self.session, upload.seq, body)
        up_key = upload_key(self.name, self.session, upload.seq, body)
        await self._retry("put upload", functools.partial(self.objects.put, up_key, body))
        self.uploads["uploads"] += 1
        key = reply_key(self.name, self.session, upload.seq)
        cadence = Cadence.of(self.cfg, answer_due=True)
        forged = 0
        while True:
            looked_at = time.monotonic()
            try:
                raw = await self._retry("get reply", lambda: self.objects.get(key, MAX_REPLY_BYTES))
            except ObjectMissing:
                await asyncio.sleep(cadence.nothing(took_s=time.monotonic() - looked_at))
                continue
            reply = open_reply(self.learner_key, self.name, self.session, upload.seq, raw)
            if reply is None:  # not the learner's: gone before the upload goes again, which the learner answers
                forged += 1
                self.uploads["forged_reply"] += 1
                detail = f"upload {upload.seq}: a reply not signed by the learner"
                self.events.emit("store", fault="forged_reply", detail=detail)
                await self._retry("delete reply", lambda: self.objects.delete(key))
                self._delete_later(up_key)
                if forged > MAX_FORGED_REPLIES:
                    return Reply(seq=upload.seq, refused="malformed", detail=f"{forged} forged replies, given up")
                up_key = upload_key(self.name, self.session, upload.seq, body, attempt=forged)
                await self._retry("put upload", functools.partial(self.objects.put, up_key, body))
                continue
            self._delete_later(key, up_key)
            try:
                return decode_reply(reply, len(upload.groups))
            except WireError as err:  # a reply that is not one: count it and let the learner answer again
                self.uploads["bad_reply"] += 1
                self.events.emit("store", fault="bad_reply", detail=str(err)[:300])
                return Reply(seq=upload.seq, refused="malformed", detail=f"unreadable reply: {err}"[:200])

    def _delete_later(self, *keys: str) -> None:
        """Objects done with (a reply read, its upload): deleted with the others within `DELETE_BATCH_S` in one
        request (`delete_many`)."""
        self._done_with.extend(keys)
        if not self._deleting:
            self._deleting = True
            self.requests.run(self._delete_done_with(), lambda _: None)

    async def _delete_done_with(self) -> None:
        try:
            while self._done_with:
                await asyncio.sleep(DELETE_BATCH_S)
                keys, self._done_with = self._done_with, []
                await self._retry("delete replies and uploads", functools.partial(self.objects.delete_many, keys))
        finally:
            self._deleting = False

    async def _retry(self, what: str, call: Callable[[], Any]) -> Any:
        began = time.monotonic()
        while True:
            try:
                result = await asyncio.get_running_loop().run_in_executor(self.pool, call)
            except StoreUnavailable as err:
                self.uploads["outage"] += 1
                self.events.emit("store", fault="outage", detail=f"{what}: {err}"[:300])
                if time.monotonic() - began > self.live.patience_s:
                    raise StoreUnreachableError(f"{what}: no answer for {self.live.patience_s:.0f} s ({err})") from None
                await asyncio.sleep(self.backoff.next_delay())
                continue
            self.backoff.reset()
            return result

    async def settle(self, timeout: float) -> None:
        await self.requests.settle(timeout)

    def close(self) -> None:
        self.requests.cancel()
        self.pool.shutdown(wait=False, cancel_futures=True)
