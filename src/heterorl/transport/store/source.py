"""Weights in, from a store: a sampler polls the manifest, downloads the cheapest chain to the newest version (its
objects at once, while its heartbeat goes up: a poll costs two round trips however long the chain), checks every
object against the manifest's size and content hash, and hands the sampler one update envelope.

It is a `WeightSource` (transport/base.py) like the HTTP client: `pull(held version, hash, ...)` returns an
update envelope (a snapshot and/or one patch: the chain's patches are merged here, so the worker applies a single
all-or-nothing update, exactly as over HTTP), None when nothing is newer, or FINISHED once the learner wrote its
`finished` marker. Faults are survived and counted, each by name, in `counts` and as `store` events:

| fault | what happened | what the source does |
| --- | --- | --- |
| missing | an object the manifest lists is gone (retention, deletion) | falls back to a snapshot |
| torn | an object's size differs from the manifest's | falls back to a snapshot |
| bad_hash | an object's content hash differs from the manifest's | falls back to a snapshot |
| bad_patch | the chain's patches do not merge (a learner bug) | falls back to a snapshot |
| stale_manifest | a manifest older than one already seen (a cache, a replica) | ignored; keeps polling |
| bad_manifest | not a manifest (malformed, over its limits) | ignored; keeps polling |
| no_path | no way to the newest version (e.g. its snapshot is missing) | keeps polling |
| outage | the store did not answer | retries with backoff; gives up after `live.patience_s` |
| unsigned, bad_signature | a manifest or object the learner did not sign | ignored (never adopted: cannot pin) |

With the learner's public key (`trust.learner_public_key`) a manifest or object it did not sign is refused
(`unsigned`, `bad_signature`): a manifest is never adopted, so a forged one cannot pin the sampler, and an object
is treated as bad. The envelope then goes one hop at a time -- the newest
snapshot with the next patch, or one patch -- each blob with the learner's signature from the manifest, so the
worker's receiver checks exactly what the learner signed (a patch merged here would carry no signature); the
sampler asks again at once for the next hop.

The sampler also writes a small heartbeat (`samplers/<name>.json`: held version, idle share, refused updates,
these counts), which the learner reads for its metrics and status, as it reads HTTP pulls' query parameters.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from heterorl.config import LiveConfig, StoreConfig
from heterorl.eventlog import EventLog
from heterorl.transport.backoff import Backoff
from heterorl.transport.base import FINISHED
from heterorl.transport.store.cadence import Cadence
from heterorl.transport.store.manifest import (
    FINISHED_KEY,
    MANIFEST_KEY,
    SAMPLERS,
    Manifest,
    ManifestError,
    ObjectRef,
    digest,
    plan,
)
from heterorl.transport.store.objects import ObjectMissing, ObjectStore, StoreUnavailable
from heterorl.weights import PatchError, Update
from heterorl.weights.envelope import encode_update
from heterorl.weights.signing import Authority, SignatureError, Signatures

HEARTBEAT_S = 5.0  # longest time between two heartbeats of a sampler whose state did not change
MAX_FINISHED_BYTES = 4096
MAX_PARALLEL_GETS = 8  # objects of one chain downloaded at once


class StoreUnreachableError(RuntimeError):
    """The store did not answer for `live.patience_s` seconds."""


class BadObjectError(ValueError):
    """An object that does not match the manifest (its reason names the fault)."""

    def __init__(self, reason: str, key: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.key = reason, key


class StoreWeightSource:
    """A sampler's weights from the store (see the module docstring). Store calls run in worker threads."""

    def __init__(
        self,
        objects: ObjectStore,
        cfg: StoreConfig,
        live: LiveConfig,
        name: str,
        backoff: Backoff,
        events: EventLog,
        merge: Callable[[list[bytes]], bytes],
        session: str = "",
        authority: Authority | None = None,
        pool: ThreadPoolExecutor | None = None,
    ) -> None:
        self.objects, self.cfg, self.live, self.name, self.session = objects, cfg, live, name, session
        self.backoff, self.events, self.merge = backoff, events, merge
        self.authority = authority
        self.pool = pool  # the threads its blocking store calls run in (None: asyncio's default executor)
        self._refused: bytes | None = None  # the last manifest refused for its signature (counted once)
        self.counts: Counter[str] = Counter()
        self.manifest: Manifest | None = None
        self._raw: bytes | None = None
        self.last_ok = time.monotonic()
        self._beat: tuple[Any, ...] | None = None
        self._beat_at = 0.0
        self.downloaded = 0
        self._count = threading.Lock()  # `downloaded` is added to by parallel downloads
        self._bad: set[str] = set()  # keys that failed their check under the current manifest

    # ---------------------------------------------------------------- WeightSource
    async def pull(
        self, version: int | None, state_hash: str | None, wait_s: float, idle: float | None, failed: int = 0
    ) -> bytes | str | None:
        """An update envelope to the newest version, None when current (after waiting up to `wait_s`), FINISHED.
        The manifest is read again at a `Cadence` (quickly at first, then every `poll_seconds`)."""
        deadline = time.monotonic() + max(wait_s, self.cfg.poll_seconds if version is None else 0.0)
        cadence = Cadence.of(self.cfg, answer_due=False)
        while True:
            looked_at = time.monotonic()
            try:  # the heartbeat's PUT and the poll's GETs at once: over a long link each is a round trip
                loop = asyncio.get_running_loop()
                _, got = await asyncio.gather(
                    loop.run_in_executor(self.pool, self._heartbeat, version, state_hash, idle, failed),
                    loop.run_in_executor(self.pool, self._poll, version, state_hash),
                )
            except StoreUnavailable as err:
                self._fault("outage", str(err))
                if time.monotonic() - self.last_ok > self.live.patience_s:
                    raise StoreUnreachableError(
                        f"no answer from {self.objects.url} for {self.live.patience_s:.0f} s ({err})"
                    ) from None
                await asyncio.sleep(self.backoff.next_delay())
                continue
            self.last_ok = time.monotonic()
            self.backoff.reset()
            if got is not None:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            await asyncio.sleep(min(cadence.nothing(took_s=time.monotonic() - looked_at), left))

    # ---------------------------------------------------------------- one poll (blocking)
    def _poll(self, version: int | None, state_hash: str | None) -> bytes | str | None:
        manifest = self._read_manifest()
        if manifest is not None:
            got = self.update_from(manifest, version, state_hash)
            if got is not None:
                return got
        if not self._finished(manifest):
            return None
        # The learner writes the marker after its last manifest: a manifest read now is the final one, while the
        # one read above may be older (the last version and the marker can land between the two reads).
        manifest = self._read_manifest()
        if manifest is not None:
            got = self.update_from(manifest, version, state_hash)
            if got is not None:
                return got
        return FINISHED

    def update_from(self, manifest: Manifest, version: int | None, state_hash: str | None) -> bytes | None:
        """The envelope from (version, hash) to `manifest`'s newest version, None when current or out of reach
        (blocking; the simulator calls it with the manifest visible at its virtual time)."""
        usable = replace(manifest, objects=tuple(o for o in manifest.objects if o.key not in self._bad))
        refs = plan(usable, version, state_hash)
        if refs is None:
            self._fault("no_path", f"no way to version {manifest.latest[0]} in the manifest")
        return self._fetch(usable, refs) if refs else None

    def _read_manifest(self) -> Manifest | None:
        """The newest valid manifest, or None (absent, stale or invalid: counted)."""
        try:
            raw = self.objects.get(MANIFEST_KEY, self.cfg.max_manifest_bytes)
        except ObjectMissing:
            return None
        if raw == self._raw:
            return self.manifest
        if raw == self._refused:
            return None
        self._bad.clear()  # a new manifest: objects found bad may have been uploaded again
        try:
            manifest = Manifest.parse(raw, self.cfg.max_manifest_bytes)
            if self.authority is not None:
                self.authority.verify_manifest(manifest.body(), manifest.signature)
        except SignatureError as err:
            self._refused = raw
            self._fault(err.reason, str(err))
            return None
        except ManifestError as err:
            self._fault("bad_manifest", str(err))
            return None
        if self.manifest is not None and manifest.order < self.manifest.order:
            self._fault("stale_manifest", f"epoch/seq {manifest.order} < {self.manifest.order} already seen")
            return None
        self.manifest, self._raw = manifest, raw
        return manifest

    def _finished(self, manifest: Manifest | None) -> bool:
        try:
            raw = self.objects.get(FINISHED_KEY, MAX_FINISHED_BYTES)
        except ObjectMissing:
            return False
        try:
            marker = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            marker = None
        if not isinstance(marker, dict) or (manifest is not None and marker.get("run") != manifest.run):
            self._fault("bad_finished", "a finished marker that is not this run's")
            return False
        return True

    def _fetch(self, manifest: Manifest, refs: list[ObjectRef]) -> bytes | None:
        """The envelope for `refs`; after a bad object, the same from a snapshot without the objects found bad
        (each object is tried once per manifest); None when no good path is left."""
        while True:
            try:
                return self._envelope(manifest, refs)
            except BadObjectError as err:
                self._fault(err.reason, str(err))
                self._bad.add(err.key)
            manifest = replace(manifest, objects=tuple(o for o in manifest.objects if o.key not in self._bad))
            fallback = plan(manifest, None, None)
            if not fallback:
                return None
            refs = fallback

    def _envelope(self, manifest: Manifest, refs: list[ObjectRef]) -> bytes:
        if self.authority is not None:
            return self._signed_hop(manifest, refs)
        blobs = self._get_all(refs)
        snapshot = blobs[0] if refs[0].kind == "snapshot" else None
        patches = blobs[1:] if snapshot is not None else blobs
        try:
            patch = None if not patches else patches[0] if len(patches) == 1 else self.merge(patches)
        except PatchError as err:
            raise BadObjectError(
                "bad_patch", refs[-1].key, f"the chain to {refs[-1].version} does not merge: {err}"
            ) from None
        version, state_hash = manifest.latest
        base = refs[0].version if snapshot is not None else refs[0].base
        update = Update(version=version, state_hash=state_hash, base_version=base, snapshot=snapshot, patch=patch)
        return encode_update(update)

    def _signed_hop(self, manifest: Manifest, refs: list[ObjectRef]) -> bytes:
        """The first hop of `refs` (a snapshot and the next patch, or one patch), each blob checked against and
        framed with the learner's signature from the manifest."""
        hop = refs[:2] if refs[0].kind == "snapshot" and len(refs) > 1 else refs[:1]
        if len(hop) == 2 and (hop[0].sig is None or hop[1].sig is None or hop[0].sig[0] != hop[1].sig[0]):
            hop = hop[:1]  # one update carries blobs signed in one epoch
        blobs = self._get_all(hop)
        assert self.authority is not None
        for ref, blob in zip(hop, blobs, strict=True):
            try:
                self.authority.verify_blobs([blob], None if ref.sig is None else Signatures(ref.sig[0], (ref.sig[1],)))
            except SignatureError as err:
                raise BadObjectError(err.reason, ref.key, f"{ref.key}: {err}") from None
        last = hop[-1]
        state_hash = manifest.hash_of(last.version)
        assert state_hash is not None, "Manifest.parse checks every object's version is listed"
        snapshot = blobs[0] if hop[0].kind == "snapshot" else None
        patch = blobs[-1] if hop[-1].kind == "patch" else None
        base = hop[0].version if snapshot is not None else hop[0].base
        assert hop[0].sig is not None
        signatures = Signatures(hop[0].sig[0], tuple(ref.sig[1] for ref in hop if ref.sig is not None))
        update = Update(last.version, state_hash, base, snapshot=snapshot, patch=patch, signatures=signatures)
        return encode_update(update)

    def _get_all(self, refs: list[ObjectRef]) -> list[bytes]:
        """Every object of `refs`, checked, downloaded at once (a chain of k objects costs one round trip, not k);
        the first bad one, in chain order, is raised."""
        if len(refs) == 1:
            return [self._get(refs[0])]
        with ThreadPoolExecutor(max_workers=min(len(refs), MAX_PARALLEL_GETS)) as pool:
            fetches = [pool.submit(self._get, ref) for ref in refs]
            return [f.result() for f in fetches]

    def _get(self, ref: ObjectRef) -> bytes:
        try:
            data = self.objects.get(ref.key, ref.nbytes)
        except ObjectMissing:
            raise BadObjectError("missing", ref.key, f"{ref.key} is not in the store") from None
        with self._count:
            self.downloaded += len(data)
        if len(data) != ref.nbytes:
            raise BadObjectError("torn", ref.key, f"{ref.key}: {len(data)} bytes, the manifest says {ref.nbytes}")
        if digest(data) != ref.digest:
            raise BadObjectError("bad_hash", ref.key, f"{ref.key}: content hash differs from the manifest's")
        return data

    # ---------------------------------------------------------------- reporting
    def _fault(self, reason: str, detail: str) -> None:
        self.counts[reason] += 1
        self.events.emit("store", fault=reason, detail=detail[:300])

    def _heartbeat(self, version: int | None, state_hash: str | None, idle: float | None, failed: int) -> None:
        """Write `samplers/<name>.json` when what it says changed, or every HEARTBEAT_S seconds."""
        state = (version, state_hash, failed, tuple(sorted(self.counts.items())))
        now = time.monotonic()
        if state == self._beat and now - self._beat_at < HEARTBEAT_S:
            return
        body = {"name": self.name, "session": self.session, "version": version, "hash": state_hash, "failed": failed}
        body["faults"] = self.counts
        body["idle"] = None if idle is None else round(min(max(idle, 0.0), 1.0), 4)
        body["time"] = time.time()
        self.objects.put(f"{SAMPLERS}{self.name}.json", json.dumps(body, sort_keys=True).encode())
        self._beat, self._beat_at = state, now
