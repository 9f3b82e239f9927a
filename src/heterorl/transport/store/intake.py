"""Uploads in, from a store: the learner lists the samplers' uploads, answers each through `LearnerLoop.exchange`
(the same intake, admission and verdicts as over HTTP) and writes the reply where the sampler looks for it. The
sampler deletes its upload with its reply once it has read it (in its batched delete: a DELETE fewer per upload;
every request costs the store and both ends CPU); the learner remembers the uploads it answered and skips them
while they are listed, forgets them once they are gone, and deletes one still there `LEFTOVER_S` after its reply
(a sampler that died or never deletes). An upload a sampler writes again (after a forged reply) has a key of its
own (`upload_key`'s `attempt`), so it is answered anew.

Exactly once, a learner crash included: a group is journaled before its reply is written, so a learner killed in
between (or restarted before the sampler deleted the upload) finds the upload again after `--resume`, and the
intake answers its groups `duplicate` (the journal replay knows their ids). Keys name the digest of the upload's
bytes as the sampler wrote them: a torn or corrupted upload is answered `corrupt` without reading its groups; one
over `live.max_body_bytes` `too_large` (without downloading it); a key that is not an upload's, or whose sampler
or session differs from what the upload says, `malformed` (deleted). Where an upload belongs, a file system entry
that is not a regular file (a FIFO, socket, device, symlink or folder: `objects.Listing.skipped`) is never opened;
it is counted once as `not_regular` and logged, and the pass goes on. A read that hangs is abandoned for that
object only (`ObjectTimeout`). Sessions are served round robin, each in order of its uploads, so one fast sampler
cannot starve the others while the learner's queue is nearly full. With `workers` > 1
(`transport.store.intake_workers`, live) up to that many sessions are served at once, each still in order. An
upload costs the learner a GET and the reply's PUT, round trips to the store; with `io_threads` (a live learner)
they leave the judging's way: the next uploads of a session are read while one is judged, and each reply is
written while the next is judged. One after another they capped one session near 40 groups/s on the WAN lab's S3
server (~0.2 s an upload). The simulator's store takes no time for them (and judges inline). With the learner's
key every reply is signed (`identity.sign_reply`), so nobody else can answer an upload.

Also here: `read_heartbeats`, the learner's view of samplers that pull weights from the store (their
`samplers/<name>.json`), fed to the loop exactly as HTTP pulls are (reports, and their leases renewed).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, NamedTuple, TypeVar

import xxhash
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from heterorl.loop.learner_loop import LearnerLoop
from heterorl.loop.protocol import Reply
from heterorl.transport.identity import CredentialRegistry, sign_reply
from heterorl.transport.store.manifest import REPLIES, SAMPLERS, UPLOADS
from heterorl.transport.store.objects import ObjectInfo, ObjectMissing, ObjectNotRegular, ObjectStore, ObjectTimeout
from heterorl.transport.wire import WireError, decode_upload, encode_reply

UPLOAD_KEY = re.compile(
    r"^up/([A-Za-z0-9._-]{1,128})/([A-Za-z0-9_-]{1,64})/([0-9]{10})-([0-9a-f]{32})(?:-([1-9][0-9]{0,2}))?\.up$"
)
MAX_HEARTBEAT_BYTES = 4096
IO_THREADS = 16  # a live learner's reads and reply writes in flight at once (the store is far: latency, not CPU)
PREFETCH_BYTES = 8 << 20  # uploads read ahead of the one being judged, by listed size (at least one is read)
T = TypeVar("T")
MAX_REMEMBERED = 100_000  # hostile entries counted once each (bounded memory)
LEFTOVER_S = 60.0  # an answered upload still there this long after its reply was written is deleted by the learner


def upload_key(sampler: str, session: str, seq: int, body: bytes, attempt: int = 0) -> str:
    """`up/<sampler>/<session>/<seq>-<digest>.up`; an upload written again (`attempt` 1, 2, ...) ends `-<attempt>.up`
    (the learner skips a key it has answered until it is gone: a rewrite under the same key would go unanswered)."""
    again = f"-{attempt}" if attempt else ""
    return f"{UPLOADS}{sampler}/{session}/{seq:010d}-{xxhash.xxh3_128_hexdigest(body)}{again}.up"


def reply_key(sampler: str, session: str, seq: int) -> str:
    return f"{REPLIES}{sampler}/{session}/{seq:010d}.reply"


class StoreIntake:
    """One pass over the store's uploads per `poll` call (run by the learner's store thread)."""

    def __init__(
        self,
        objects: ObjectStore,
        loop: LearnerLoop,
        max_body_bytes: int,
        max_groups: int,
        credentials: CredentialRegistry | None = None,
        workers: int = 1,
        signing_key: Ed25519PrivateKey | None = None,
        io_threads: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.objects, self.loop, self.max_body, self.max_groups = objects, loop, max_body_bytes, max_groups
        self.credentials = credentials  # `trust.credentials`: every upload signed by its sampler's key
        self.signing_key = signing_key  # `trust.learner_private_key`: every reply signed (`identity.sign_reply`)
        self.counts: Counter[str] = Counter()  # what happened to upload objects (the loop counts the groups)
        self.downloaded = 0
        self.refused_entries: set[str] = set()  # keys of entries that are not regular files, counted already
        self.answered: dict[str, float] = {}  # upload keys answered and still listed -> when their reply was written
        self.clock = clock
        self._lock = threading.Lock()  # the counts above, from the workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="store-intake") if workers > 1 else None
        self._io = ThreadPoolExecutor(io_threads, thread_name_prefix="store-io") if io_threads > 0 else None

    def poll(self) -> int:
        """Answer every upload in the store (sessions round robin, each in order); returns the number answered.
        StoreUnavailable propagates (the caller backs off) once every session's pass has ended."""
        listing = self.objects.list(UPLOADS)
        for entry in getattr(listing, "skipped", ()):
            self._not_regular(entry.key, entry.kind)
        uploads = self._unanswered([o for o in listing if o.key.endswith(".up")])
        if self._pool is None or len(uploads) < 2:
            return self._pass(_round_robin(uploads))
        passes = [self._pool.submit(self._pass, infos) for infos in _by_session(uploads).values()]
        return sum(p.result() for p in passes)

    def _unanswered(self, listed: list[ObjectInfo]) -> list[ObjectInfo]:
        """The listed uploads not answered yet. Answered keys no longer listed are forgotten (their sampler deleted
        them); those listed `LEFTOVER_S` after their reply are deleted here. Runs between passes (nothing answers)."""
        keys = {info.key for info in listed}
        now = self.clock()
        self.answered = {key: at for key, at in self.answered.items() if key in keys}
        answered = set(self.answered)
        for key in [key for key, at in self.answered.items() if now - at > LEFTOVER_S]:  # rare: a request each
            del self.answered[key]
            try:
                self.objects.delete(key)
            except ObjectNotRegular as err:  # swapped for a folder since it was answered: counted, never opened
                self._not_regular(key, err.kind)
        return [info for info in listed if info.key not in answered]

    def _pass(self, infos: list[ObjectInfo]) -> int:
        """Judge the uploads in this order; with I/O threads, read the next ones (up to `PREFETCH_BYTES` listed)
        while one is judged, and write each reply while the next is judged. Returns once every reply is written:
        the next listing must know every upload answered (`answered`)."""
        reads: deque[tuple[ObjectInfo, UploadKey | None, Future[bytes | bool | Reply]]] = deque()
        answers: list[Future[bool]] = []
        pending = iter(infos)
        reading = 0  # listed bytes of the reads in `reads`
        handled = 0
        try:
            while True:
                while not reads or (self._io is not None and reading < PREFETCH_BYTES):
                    info = next(pending, None)
                    if info is None:
                        break
                    key = parse_upload_key(info.key)
                    reads.append((info, key, self._run(self._read, info, key)))
                    reading += info.size
                if not reads:
                    break
                info, key, read = reads.popleft()
                reading -= info.size
                outcome = self._judge(info, key, read.result())
                if isinstance(outcome, Reply):
                    answers.append(self._run(self._answer, info.key, key, outcome))
                else:
                    handled += outcome
        finally:  # nothing of this pass runs on once it returns (or raises, e.g. StoreUnavailable)
            for *_, read in reads:
                read.cancel()
            wait([read for *_, read in reads] + answers)
        return handled + sum(a.result() for a in answers)  # a failed write (StoreUnavailable) raises here

    def _run(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """`fn(*args)` in an I/O thread, or here and now (a finished future) without them."""
        if self._io is not None:
            return self._io.submit(fn, *args)
        done: Future[T] = Future()
        try:
            done.set_result(fn(*args))
        except BaseException as err:  # re-raised by .result(), where a thread's error would be
            done.set_exception(err)
        return done

    def _read(self, info: ObjectInfo, key: UploadKey | None) -> bytes | bool | Reply:
        """The upload's bytes; or a reply decided without them (too large); or True (handled: a key no upload
        can have, deleted) / False (nothing to answer now: gone, hung, or not a regular file)."""
        if key is None:
            self._refuse_key(info.key, "malformed", f"not an upload key: {info.key[:100]}")
            return True
        seq = key.seq
        if info.size > self.max_body:
            return self._refuse("too_large", f"{info.size} bytes > {self.max_body}", seq)
        try:
            body = self.objects.get(info.key, self.max_body)
        except ObjectNotRegular as err:  # swapped for a FIFO or a symlink after the listing
            self._not_regular(info.key, err.kind)
            return False
        except ObjectMissing:
            return False  # gone meanwhile (rewritten under a new key by its sampler, or another learner answered it)
        except ObjectTimeout:  # a hung read: that object is tried again at the next pass, the others go on
            self._count("timeout")
            return False
        self._downloaded(len(body))
        if len(body) > self.max_body:
            return self._refuse("too_large", "over the limit", seq)
        return body

    def _judge(self, info: ObjectInfo, key: UploadKey | None, read: bytes | bool | Reply) -> bool | Reply:
        """What `_read` gave, checked and through `LearnerLoop.exchange`: the reply to write, or handled / not."""
        if not isinstance(read, bytes):
            return read
        sampler, session, seq, digest = key  # bytes are read only under an upload's key (never None here)
        body = read
        if xxhash.xxh3_128_hexdigest(body) != digest:
            return self._refuse("corrupt", "the upload does not match the digest in its key", seq)
        if self.credentials is not None:
            who, body = self.credentials.open_upload(sampler, session, seq, body)
            if not who.ok:
                return self._refuse(who.reason, f"the upload under {sampler[:64]!r} is not signed by its key", seq)
        try:
            upload = decode_upload(body, self.max_groups)
        except WireError as err:
            return self._refuse("malformed", str(err), seq)
        if (upload.sampler, upload.session, upload.seq) != (sampler, session, seq):
            self._refuse_key(info.key, "malformed", "the upload's sampler, session or seq differs from its key")
            return True
        return self.loop.exchange(upload)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._io is not None:
            self._io.shutdown(wait=True)

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def _downloaded(self, nbytes: int) -> None:
        with self._lock:
            self.downloaded += nbytes

    def _not_regular(self, key: str, kind: str) -> None:
        """Count (once) an entry that is not a regular file where an upload belongs; it is never opened."""
        with self._lock:
            if key in self.refused_entries or len(self.refused_entries) >= MAX_REMEMBERED:
                return
            self.refused_entries.add(key)
        self.loop.intake.reject("not_regular", f"a {kind} at {key[:120]}")
        self._count("not_regular")

    def _refuse(self, reason: str, detail: str, seq: int) -> Reply:
        self.loop.intake.reject(reason, detail)
        return Reply(seq=seq, refused=reason, detail=detail[:200])

    def _refuse_key(self, key: str, reason: str, detail: str) -> None:
        """An object nobody can be answered for: counted and deleted."""
        self.loop.intake.reject(reason, detail)
        self._count(reason)
        self.objects.delete(key)

    def _answer(self, object_key: str, key: UploadKey, reply: Reply) -> bool:
        """The reply written; the upload is its sampler's to delete (a crash before answers it again, idempotently)."""
        sampler, session, seq, _ = key
        body = encode_reply(reply)
        if self.signing_key is not None:
            body = sign_reply(self.signing_key, sampler, session, seq, body)
        self.objects.put(reply_key(sampler, session, seq), body)
        with self._lock:
            self.answered[object_key] = self.clock()
        self._count(reply.refused or "answered")
        return True


class UploadKey(NamedTuple):
    """What an upload's object key names (`upload_key`)."""

    sampler: str
    session: str
    seq: int
    digest: str


def parse_upload_key(key: str) -> UploadKey | None:
    """The fields of an upload's key; None for a key no upload can have."""
    match = UPLOAD_KEY.match(key)
    return None if match is None else UploadKey(match[1], match[2], int(match[3]), match[4])


def _by_session(listing: list[ObjectInfo]) -> dict[str, list[ObjectInfo]]:
    """The uploads of each session (the key's folder), each in order of its upload number."""
    out: dict[str, list[ObjectInfo]] = {}
    for info in sorted(listing, key=lambda i: i.key):
        out.setdefault(info.key.rsplit("/", 1)[0], []).append(info)
    return out


def _round_robin(listing: list[ObjectInfo]) -> list[ObjectInfo]:
    """Uploads by session (each in seq order: keys sort by seq), sessions interleaved."""
    by_session = _by_session(listing)
    columns = [by_session[s] for s in sorted(by_session)]
    return [i for row in itertools.zip_longest(*columns) for i in row if i is not None]


def read_heartbeats(objects: ObjectStore, loop: LearnerLoop, seen: dict[str, Any]) -> None:
    """Feed the loop from the samplers' heartbeats; `seen` remembers each one's last `time` (a sampler counts
    as heard from only when its heartbeat changed). Malformed heartbeats are skipped."""
    for info in objects.list(SAMPLERS):
        if not info.key.endswith(".json") or info.size > MAX_HEARTBEAT_BYTES:
            continue
        try:
            beat = json.loads(objects.get(info.key, MAX_HEARTBEAT_BYTES))
        except (ObjectMissing, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(beat, dict) or seen.get(info.key) == beat.get("time"):
            continue
        seen[info.key] = beat.get("time")
        name = info.key.removeprefix(SAMPLERS).removesuffix(".json")
        version, idle, failed, session = beat.get("version"), beat.get("idle"), beat.get("failed"), beat.get("session")
        loop.heard(
            name,
            session if isinstance(session, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", session) else None,
            version if _is_int(version) else None,
            float(idle) if isinstance(idle, float | int) and math.isfinite(idle) and 0 <= idle <= 1 else None,
            failed if _is_int(failed) else None,
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53
