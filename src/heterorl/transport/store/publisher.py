"""Weights out, through a store: each version's objects uploaded once, the manifest written last, old objects retired.

The learner's `BackgroundPublisher` calls `published` in its publishing thread right after a version is in the
`WeightStore`; it only takes the version's bytes out of the store (its patch from the previous version, its
snapshot when the store made one) and queues them, so the training thread never waits for the network. An
uploader thread then, in version order: computes the power-of-two merged patches (`merged_patches`), puts every
new object (immutable, named by content hash), and only then rewrites the manifest, so a reader never sees a
version whose objects are not all there. A store outage leaves the queue growing; uploads resume, in order, when
the store answers again (counted as `outage`).

Merged patches: with i = version - newest snapshot version and 2^k the largest power of two dividing i, version
v also gets the patch (v - 2^k, v] (k >= 1), merged from ones already built; so a sampler d versions behind
needs O(log d) objects, and the learner uploads about two patches' worth per version whatever the number of
samplers. Objects leave the manifest with the WeightStore's retention and are deleted `retention_seconds` later,
so a sampler that read an older manifest can still finish its downloads.

With the learner's signing key (`trust.learner_private_key`) every object is signed as it is built and every
manifest as it is written, in this life's epoch (manifest.py, weights/signing.py).
"""

from __future__ import annotations

import json
import queue
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from heterorl.config import StoreConfig
from heterorl.transport.store.manifest import (
    FINISHED_KEY,
    MANIFEST_KEY,
    OBJECTS,
    Manifest,
    ManifestError,
    ObjectRef,
    digest,
    object_key,
)
from heterorl.transport.store.objects import ObjectMissing, ObjectStore, StoreSetupError, StoreUnavailable
from heterorl.weights import Published, PulseCodec, WeightStore, merge_patches
from heterorl.weights.signing import Signer


@dataclass
class VersionParts:
    """One published version's bytes, taken from the WeightStore in the publishing thread."""

    version: int
    state_hash: str
    patch: bytes | None  # from the previous published version
    base: int | None  # the version `patch` applies to
    snapshot: bytes | None
    full_nbytes: int  # what this version's full wire-dtype weights would cost
    built: list[tuple[ObjectRef, bytes]] | None = None  # its objects, once built (a retried upload reuses them)


@dataclass
class _Segment:
    """The merged patches since the newest snapshot (index = version - snapshot version)."""

    snapshot_version: int
    merged: dict[int, tuple[int, bytes]] = field(default_factory=dict)  # index -> (base version, patch)


def lowbit(i: int) -> int:
    return i & -i


class StorePublisher:
    """Uploads versions to a store and writes the manifest; see the module docstring.

    `clock` gives seconds for retention (monotonic wall time live, virtual time in the simulator); `on_uploaded`
    is told (version, bytes uploaded, full bytes) when a version is visible to samplers. Uploads run in the
    uploader thread after `start`, or in the owner's thread at each `drain` (the simulator).
    """

    def __init__(
        self,
        objects: ObjectStore,
        weights: WeightStore,
        cfg: StoreConfig,
        *,
        resume: bool,
        clock: Callable[[], float] = time.monotonic,
        on_uploaded: Callable[[int, int, int], None] | None = None,
        signing_key: Ed25519PrivateKey | None = None,
    ) -> None:
        self.objects, self.weights, self.cfg, self.clock = objects, weights, cfg, clock
        self.on_uploaded = on_uploaded or (lambda v, n, f: None)
        self.counts: Counter[str] = Counter()
        self.uploaded_bytes = 0
        self._prev: tuple[int, str] | None = None
        self._hashes: dict[int, str] = {}
        self._live: dict[str, ObjectRef] = {}  # key -> object listed in the manifest
        self._done_keys: set[str] = set()  # uploaded in this life
        self._retired: dict[str, float] = {}  # key -> clock time it left the manifest
        self._segment: _Segment | None = None
        self._queue: queue.Queue[VersionParts | None] = queue.Queue()
        self._pending: list[VersionParts] = []
        self._thread: threading.Thread | None = None
        self.manifest: Manifest | None = None
        self.finished_written = False
        self.last_queued = -1  # the newest version `published` has taken
        self.run, self.epoch = self._claim(resume)
        self.signer = None if signing_key is None else Signer(signing_key, self.epoch)
        self.seq = 0
        self._visible_log: list[tuple[int, int]] = []  # (version, bytes uploaded for it), in upload order

    # ---------------------------------------------------------------- setup
    def _claim(self, resume: bool) -> tuple[str, int]:
        """(run id, epoch): a fresh run needs an empty prefix; a resumed one continues the manifest's run."""
        try:
            raw = self.objects.get(MANIFEST_KEY, self.cfg.max_manifest_bytes)
        except ObjectMissing:
            raw = None
        if raw is None:
            leftovers = [o.key for o in self.objects.list(OBJECTS)] + [o.key for o in self.objects.list("rollouts/")]
            if not resume and leftovers:
                raise StoreSetupError(
                    f"{self.objects.url} already holds objects ({leftovers[0]}, ...): use a new prefix for every run"
                )
            return secrets.token_hex(8), 0
        if not resume:
            raise StoreSetupError(
                f"{self.objects.url} already holds a run ({MANIFEST_KEY}): use a new prefix, or pass --resume"
            )
        try:
            old = Manifest.parse(raw, self.cfg.max_manifest_bytes)
        except ManifestError as err:
            raise StoreSetupError(f"--resume: the manifest at {self.objects.url} is unreadable ({err})") from None
        for ref in old.objects:  # the new life publishes afresh; the old objects retire
            self._retire_later(ref.key)
        return old.run, old.epoch + 1

    def start(self) -> None:
        """Upload in a thread of its own from now on (else the owner calls `drain`)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="store-upload", daemon=True)
            self._thread.start()

    # ---------------------------------------------------------------- publishing thread
    def published(self, published: Published) -> None:
        """`BackgroundPublisher.on_published`: take this version's bytes out of the WeightStore and queue them."""
        store = self.weights
        patch = base = snapshot = None
        if self._prev is not None:
            update = store.update_for(*self._prev)  # this version's own patch, unless a snapshot is smaller
            if update.kind == "patch" and update.base_version == self._prev[0]:
                patch, base = update.patch, self._prev[0]
        if published.snapshot_nbytes is not None:
            snapshot = store.update_for(None, None).snapshot  # the newest snapshot is this version's
        self._prev = (published.version, published.state_hash)
        self.last_queued = published.version
        itemsize = 2 if store.wire_dtype is None else store.wire_dtype.itemsize
        parts = VersionParts(published.version, published.state_hash, patch, base, snapshot, published.numel * itemsize)
        self._queue.put(parts)

    def drain(self) -> list[tuple[int, int]]:
        """Upload what is queued now, in the caller's thread (the simulator, for determinism; tests); returns
        (version, bytes uploaded) per version made visible. StoreUnavailable propagates (nothing is lost)."""
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not None:
                self._pending.append(item)
        before = len(self._visible_log)
        self._flush()
        return self._visible_log[before:]

    # ---------------------------------------------------------------- uploader
    def _run(self) -> None:
        delay = self.cfg.poll_seconds
        while True:
            try:
                item = self._queue.get(timeout=delay if self._pending else None)
            except queue.Empty:
                item = ...
            if item is None:
                if self._pending:
                    self._flush_quietly()
                return
            if item is not ...:
                self._pending.append(item)
                while not self._queue.empty():  # take everything queued: one manifest for the lot
                    nxt = self._queue.get_nowait()
                    if nxt is None:
                        self._flush_quietly()
                        return
                    self._pending.append(nxt)
            delay = self.cfg.poll_seconds if self._flush_quietly() else min(2 * delay, 30.0)

    def _flush_quietly(self) -> bool:
        try:
            self._flush()
        except StoreUnavailable:
            self.counts["outage"] += 1
            return False
        return True

    def _flush(self) -> None:
        """Upload every pending version's objects, then one manifest (StoreUnavailable: retried later)."""
        visible: list[tuple[int, int, int]] = []
        for parts in self._pending:
            nbytes = sum(self._put(ref, blob) for ref, blob in self._objects_of(parts))
            self._hashes[parts.version] = parts.state_hash
            visible.append((parts.version, nbytes, parts.full_nbytes))
        if not visible:
            return
        manifest = self._manifest()
        data = manifest.to_bytes()
        self.objects.put(MANIFEST_KEY, data)
        self.manifest, self.seq = manifest, self.seq + 1
        self._pending.clear()
        for i, (version, nbytes, full) in enumerate(visible):
            extra = len(data) if i == len(visible) - 1 else 0  # the manifest, charged to the newest version
            self.uploaded_bytes += nbytes + extra
            self._visible_log.append((version, nbytes + extra))
            self.on_uploaded(version, nbytes + extra, full)
        self._collect()

    def _put(self, ref: ObjectRef, blob: bytes) -> int:
        self._live[ref.key] = ref
        self._retired.pop(ref.key, None)
        if ref.key in self._done_keys:
            return 0
        self.objects.put(ref.key, blob)
        self._done_keys.add(ref.key)
        self.counts["objects"] += 1
        return len(blob)

    def _objects_of(self, parts: VersionParts) -> list[tuple[ObjectRef, bytes]]:
        """The version's snapshot, patch and merged patch (built once; a retried flush reuses them)."""
        if parts.built is not None:
            return parts.built
        out = []
        if parts.snapshot is not None:
            out.append(self._ref("snapshot", None, parts.version, parts.snapshot))
        if parts.patch is not None and parts.base is not None:
            out.append(self._ref("patch", parts.base, parts.version, parts.patch))
        if parts.snapshot is not None:
            self._segment = _Segment(parts.version)  # merged patches start again from the new snapshot
        else:
            out += self._merged(parts)
        parts.built = out
        return out

    def _merged(self, parts: VersionParts) -> list[tuple[ObjectRef, bytes]]:
        seg = self._segment
        if seg is None or parts.patch is None or parts.base is None:
            return []
        i = parts.version - seg.snapshot_version
        if parts.base != parts.version - 1 or i <= 0:  # merged patches assume consecutive versions
            self._segment = None
            return []
        seg.merged[i] = (parts.base, parts.patch)
        k = lowbit(i)
        if k == 1 or not self.cfg.merged_patches or not isinstance(self.weights.codec, PulseCodec):
            return []  # format-2 patches (pulse-ctx) merge only against the newest weights: chains of single patches
        pieces = [seg.merged.get(i - j) for j in _powers_below(k)] + [(parts.base, parts.patch)]
        if any(p is None for p in pieces):
            return []
        merged = merge_patches([p[1] for p in pieces if p is not None], level=self.weights.codec.level)
        seg.merged[i] = (parts.version - k, merged)
        return [self._ref("patch", parts.version - k, parts.version, merged)]

    def _ref(self, kind: str, base: int | None, version: int, blob: bytes) -> tuple[ObjectRef, bytes]:
        d = digest(blob)
        sig = None if self.signer is None else (self.signer.epoch, self.signer.sign_blob(blob))
        return ObjectRef(object_key(kind, base, version, d), kind, base, version, len(blob), d, sig), blob  # type: ignore[arg-type]

    def _manifest(self) -> Manifest:
        """Versions the WeightStore retains; objects whose versions are all retained; the newest snapshot only."""
        retained = [v for v in self.weights.versions if v in self._hashes]
        keep = set(retained)
        newest_snapshot = max((r.version for r in self._live.values() if r.kind == "snapshot"), default=None)
        listed = []
        for key, ref in list(self._live.items()):
            ok = ref.version in keep and (ref.base in keep if ref.kind == "patch" else ref.version == newest_snapshot)
            if ok:
                listed.append(ref)
            else:
                del self._live[key]
                self._retire_later(key)
        for v in list(self._hashes):
            if v not in keep:
                del self._hashes[v]
        listed.sort(key=lambda r: (r.version, r.base is not None, r.base or 0))
        versions = tuple((v, self._hashes[v]) for v in retained)
        manifest = Manifest(self.run, self.epoch, self.seq, versions, tuple(listed))
        if self.signer is None:
            return manifest
        return replace(manifest, signature=self.signer.sign_manifest(manifest.body()))

    # ---------------------------------------------------------------- retention
    def _retire_later(self, key: str) -> None:
        self._retired.setdefault(key, self.clock())

    def _collect(self) -> None:
        """Delete objects that left the manifest more than `retention_seconds` ago."""
        now = self.clock()
        for key, since in list(self._retired.items()):
            if now - since >= self.cfg.retention_seconds:
                self.objects.delete(key)
                self._done_keys.discard(key)
                del self._retired[key]
                self.counts["deleted"] += 1

    # ---------------------------------------------------------------- the end
    def finish(self, version: int, timeout_s: float) -> bool:
        """Drain the uploads and write the `finished` marker (retrying through an outage for up to `timeout_s`)."""
        self.close(timeout_s)
        deadline = time.monotonic() + timeout_s
        body = json.dumps({"run": self.run, "version": version}).encode()
        while True:
            try:
                if self._pending:
                    self._flush()
                self.objects.put(FINISHED_KEY, body)
                self.finished_written = True
                return True
            except StoreUnavailable:
                self.counts["outage"] += 1
                if time.monotonic() > deadline:
                    return False
                time.sleep(min(self.cfg.poll_seconds, 1.0))

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the uploader after the queued versions (waits up to `timeout_s`)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout_s)
            self._thread = None


def _powers_below(k: int) -> list[int]:
    """k/2, ..., 2, 1 for k a power of two (the offsets of the merged pieces, oldest first)."""
    out, j = [], k // 2
    while j >= 1:
        out.append(j)
        j //= 2
    return out
