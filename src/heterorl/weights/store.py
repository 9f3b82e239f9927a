"""Versioned weight store on the learner side and the receiver on the sampler side.

Publishing version v (versions strictly increase; they need not be consecutive) builds, outside any lock:
a patch from the previous version (pulse codec), plus a snapshot on the first publish, every `snapshot_every`
publishes, whenever the chain since the last snapshot would exceed `max_chain`, and on every publish of the
full codec. Only then is everything swapped in under the lock, so a reader never sees a version without all its
parts (atomic publication; a failed encode leaves the store as it was).

Kept: the last `retain` versions' hashes and patch records (v1 patches from the predecessor, what merges start
from), every version since the newest snapshot (so a fresh receiver can always be served), the newest snapshot
only (an older snapshot plus a longer chain never beats it), the latest version's patch as receivers download it
(the codec's wire form: the record itself for "pulse", a v2 patch for "pulse-ctx"), and the store's own copy of
the latest weights (the base of the next patch, and what "pulse-ctx" re-codes merged patches against) plus a
spare copy reused for the next publish (two model copies in the wire dtype; a copy that a merge is still
reading is never reused). With `device="cuda"` those copies live on the GPU and patches are diffed and
classified there (diffscan.py, classes.py); only the changes, the hashes' bytes and snapshots cross to the host.

`update_for(held_version, held_hash)` serves the smallest correct update: nothing if current; else the
candidates are (a) the merged patch held -> latest, if the held version is retained, its hash matches and the
chain is at most `max_chain` patches, and (b) the newest snapshot plus the merged patch snapshot -> latest; the
fewer bytes wins. An unknown/too old version or a hash mismatch leaves only (b). Merged patches are cached per
latest version, since many samplers ask for the same one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from heterorl.weights.codecs import EncodedPatch, SyncCodec, make_codec
from heterorl.weights.format import PatchError, StateDict
from heterorl.weights.hashing import state_hash
from heterorl.weights.patch import apply_patch, patch_info, revert_patch
from heterorl.weights.signing import Authority, SignatureError, Signatures
from heterorl.weights.snapshot import load_snapshot

if TYPE_CHECKING:
    from heterorl.config import WeightsConfig


@dataclass(frozen=True)
class Update:
    """What a receiver downloads: a snapshot and/or a patch, applied in that order, or nothing."""

    version: int  # version held after applying
    state_hash: str  # its state hash
    base_version: int | None  # version `patch` applies to (the snapshot's when there is one)
    snapshot: bytes | None = None
    patch: bytes | None = None
    signatures: Signatures | None = None  # the learner's, of the blobs in order (weights/signing.py)

    @property
    def blobs(self) -> list[bytes]:
        """The blobs it carries, in the order they apply (snapshot, then patch)."""
        return [b for b in (self.snapshot, self.patch) if b is not None]

    @property
    def kind(self) -> Literal["noop", "patch", "snapshot"]:
        if self.snapshot is not None:
            return "snapshot"
        return "noop" if self.patch is None else "patch"

    @property
    def nbytes(self) -> int:
        """Bytes on the wire (charge these to the link)."""
        return len(self.snapshot or b"") + len(self.patch or b"")


@dataclass(frozen=True)
class Published:
    """What one publish produced (sizes for metrics and link accounting)."""

    version: int
    state_hash: str
    patch_nbytes: int | None  # None: no patch (first version, or the full codec)
    snapshot_nbytes: int | None  # None: no snapshot this version
    changed: int | None  # elements the patch overwrites
    numel: int
    seconds: float  # encode wall time
    patch_skipped: bool = False  # the diff showed a patch would not pay (weights.patch_max_ratio): a snapshot went


class WeightStore:
    """Keeps published versions as patches and snapshots; serves receivers the smallest correct update."""

    def __init__(
        self,
        codec: SyncCodec,
        *,
        snapshot_every: int = 10,
        max_chain: int = 16,
        retain: int = 64,
        wire_dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
        patch_max_ratio: float | None = None,
    ) -> None:
        assert snapshot_every >= 1, f"snapshot_every must be >= 1, got {snapshot_every}"
        assert max_chain >= 1, f"max_chain must be >= 1, got {max_chain}"
        assert retain >= 1, f"retain must be >= 1, got {retain}"
        self.codec = codec
        self.snapshot_every = snapshot_every
        self.max_chain = max_chain
        self.retain = retain
        self.wire_dtype = wire_dtype
        self.device = torch.device(device)  # where the store's weight copies live and patches are diffed
        self.patch_max_ratio = patch_max_ratio  # skip coding a patch estimated above this share of the snapshot
        self._lock = threading.Lock()  # guards everything below
        self._publish_lock = threading.Lock()  # one publish at a time
        self._order: list[int] = []  # retained versions, oldest first
        self._hashes: dict[int, str] = {}
        self._records: dict[int, bytes] = {}  # version -> v1 patch from its predecessor (merge input)
        self._wire_nbytes: dict[int, int] = {}  # version -> size of that patch as receivers download it
        self._latest_wire: bytes | None = None  # the latest version's patch as receivers download it
        self._snapshot: tuple[int, bytes] | None = None  # newest snapshot
        self._since_snapshot = 0  # publishes since the newest snapshot
        self._last: dict[str, torch.Tensor] | None = None  # store-owned copy of the latest weights
        self._spare: dict[str, torch.Tensor] | None = None  # the previous copy, reused as the next one
        self._merged: dict[tuple[int, int], bytes] = {}  # (from, to) -> merged patch, for the latest `to` only
        self._pinned: dict[int, int] = {}  # id of a weights copy -> merges reading it (never reused meanwhile)

    @classmethod
    def from_config(cls, cfg: WeightsConfig, *, workers: int | None = None) -> WeightStore:
        """Store for `cfg` (codec, its threads, wire dtype, snapshot cadence, chain limit, retention, zstd level,
        the snapshot-or-patch ratio); `workers` overrides `cfg.codec_threads`."""
        return cls(
            make_codec(cfg.codec, level=cfg.zstd_level, workers=cfg.codec_threads if workers is None else workers),
            snapshot_every=cfg.snapshot_every,
            max_chain=cfg.max_chain,
            retain=cfg.retain,
            wire_dtype=getattr(torch, cfg.wire_dtype),
            patch_max_ratio=cfg.patch_max_ratio,
        )

    # --- learner side
    def publish(self, version: int, weights: StateDict) -> Published:
        """Make `version` available; returns its sizes. The store copies (and casts) `weights`."""
        with self._publish_lock:
            start = time.perf_counter()
            latest = self.latest_version
            if latest is not None and version <= latest:
                raise ValueError(f"version {version} is not newer than the latest published version {latest}")
            new = self._wire_copy(weights)
            encoded: EncodedPatch | None = None
            if self._last is not None and latest is not None:
                base_hash = self._hashes[latest]
                limit = None
                if self.patch_max_ratio is not None and self._snapshot is not None:
                    limit = int(self.patch_max_ratio * len(self._snapshot[1]))
                encoded = self.codec.encode_patch(
                    self._last, new, base_hash=base_hash, versions=(latest, version), max_nbytes=limit
                )
            patch = None if encoded is None or encoded.skipped else encoded
            new_hash = encoded.result_hash if encoded is not None else state_hash(new)
            chain = self._since_snapshot + 1  # patches since the newest snapshot if this one is not one
            snapshot = None
            if patch is None or chain >= self.snapshot_every or chain > self.max_chain:
                on_host = new if self.device.type == "cpu" else {k: v.cpu() for k, v in new.items()}
                snapshot = self.codec.encode_snapshot(on_host, state_hash=new_hash, version=version)
            with self._lock:
                self._commit(version, new_hash, patch, snapshot)
                self._spare, self._last = self._last, new
            return Published(
                version=version,
                state_hash=new_hash,
                patch_nbytes=None if patch is None or patch.wire is None else len(patch.wire),
                snapshot_nbytes=None if snapshot is None else len(snapshot),
                changed=None if encoded is None else encoded.changed,
                numel=sum(t.numel() for t in new.values()),
                seconds=time.perf_counter() - start,
                patch_skipped=encoded is not None and encoded.skipped,
            )

    def _wire_copy(self, weights: StateDict) -> dict[str, torch.Tensor]:
        """The store's copy of `weights` in the wire dtype, written into the spare buffers when they fit.

        Double buffering keeps a second model copy at rest (the peak during a publish is the same as with a
        fresh copy: old and new both exist while the patch is encoded) but avoids allocating a model copy per
        publish, which costs seconds per GB where page faults are slow (this sandbox VM).
        """
        with self._lock:
            spare, self._spare = self._spare, None
            if spare is not None and self._pinned.get(id(spare)):
                spare = None  # a merge is still re-coding against it
        out = {}
        for name in sorted(weights):
            t = weights[name].detach()
            dtype = self.wire_dtype if self.wire_dtype is not None and t.is_floating_point() else t.dtype
            buf = None if spare is None else spare.get(name)
            if buf is not None and buf.dtype == dtype and buf.shape == t.shape:
                out[name] = buf.copy_(t)
            else:
                out[name] = t.to(device=self.device, dtype=dtype, copy=True).contiguous()
        return out

    def _commit(self, version: int, new_hash: str, patch: EncodedPatch | None, snapshot: bytes | None) -> None:
        self._order.append(version)
        self._hashes[version] = new_hash
        self._latest_wire = None if patch is None else patch.wire
        if patch is not None:
            assert patch.record is not None
            assert patch.wire is not None
            self._records[version] = patch.record
            self._wire_nbytes[version] = len(patch.wire)
        if snapshot is not None:
            self._snapshot = (version, snapshot)
            self._since_snapshot = 0
        else:
            self._since_snapshot += 1
        self._merged.clear()
        assert self._snapshot is not None, "the first publish always has a snapshot"
        snapshot_version = self._snapshot[0]
        while len(self._order) > self.retain and self._order[0] < snapshot_version:
            old = self._order.pop(0)
            del self._hashes[old]
            self._records.pop(old, None)
            self._wire_nbytes.pop(old, None)
        self._records.pop(self._order[0], None)  # its predecessor is gone, so is any use for it
        self._wire_nbytes.pop(self._order[0], None)

    # --- sampler side
    def update_for(self, held_version: int | None, held_hash: str | None) -> Update:
        """The smallest correct update from what the receiver holds (None, None: nothing usable)."""
        with self._lock:
            if not self._order:
                raise LookupError("nothing has been published yet")
            order = list(self._order)
            latest = order[-1]
            latest_hash = self._hashes[latest]
            chain = self._patch_chain(held_version, held_hash)
            if chain == [latest]:
                return Update(version=latest, state_hash=latest_hash, base_version=latest)
            assert self._snapshot is not None
            snap_version, snapshot = self._snapshot
            records = dict(self._records)
            latest_wire = self._latest_wire
            last = self._last
            assert last is not None
            self._pinned[id(last)] = self._pinned.get(id(last), 0) + 1
        try:
            patch_update = None
            if chain is not None:
                patch = self._merged_patch(chain, records, latest_wire, last)
                patch_update = Update(version=latest, state_hash=latest_hash, base_version=held_version, patch=patch)
                if len(snapshot) >= patch_update.nbytes:
                    return patch_update
            tail = None
            if snap_version != latest:
                tail = self._merged_patch(order[order.index(snap_version) :], records, latest_wire, last)
            snap_update = Update(latest, latest_hash, base_version=snap_version, snapshot=snapshot, patch=tail)
            if patch_update is not None and patch_update.nbytes <= snap_update.nbytes:
                return patch_update
            return snap_update
        finally:
            with self._lock:
                self._pinned[id(last)] -= 1
                if not self._pinned[id(last)]:
                    del self._pinned[id(last)]

    def _merged_patch(
        self, versions: list[int], records: Mapping[int, bytes], latest_wire: bytes | None, last: StateDict
    ) -> bytes:
        """Patch versions[0] -> versions[-1] (the latest) as receivers download it, cached while it stays latest."""
        if len(versions) == 2:
            assert latest_wire is not None
            return latest_wire
        key = (versions[0], versions[-1])
        with self._lock:
            cached = self._merged.get(key)
        if cached is not None:
            return cached
        merged = self.codec.merge([records[v] for v in versions[1:]], last)
        with self._lock:
            if self._order and self._order[-1] == versions[-1]:
                self._merged[key] = merged
        return merged

    # --- a verifier's view of older versions
    def weights_at(self, version: int) -> dict[str, torch.Tensor]:
        """A fresh CPU copy of retained `version`'s wire-dtype weights, rebuilt from the latest copy by reverting
        the patch records after it, newest first, and checked against the version's hash. LookupError when it
        cannot be rebuilt: not retained, or no patch records (the full codec keeps only the newest version)."""
        with self._lock:
            if version not in self._hashes:
                raise LookupError(
                    f"version {version} is not retained (retained: {self._order[:1]}..{self._order[-1:]})"
                )
            later = self._order[self._order.index(version) + 1 :]
            missing = [v for v in later if v not in self._records]
            if missing:
                raise LookupError(f"no patch record for version {missing[0]}: cannot rebuild version {version}")
            records = [self._records[v] for v in reversed(later)]
            expected = self._hashes[version]
            last = self._last
            assert last is not None
            self._pinned[id(last)] = self._pinned.get(id(last), 0) + 1
        try:
            weights = {name: t.detach().to("cpu", copy=True) for name, t in last.items()}
        finally:
            with self._lock:
                self._pinned[id(last)] -= 1
                if not self._pinned[id(last)]:
                    del self._pinned[id(last)]
        for record in records:
            revert_patch(weights, record)
        if state_hash(weights) != expected:
            raise PatchError(f"version {version} rebuilt from the newest does not hash to its published hash")
        return weights

    # --- introspection (sizes for link accounting and metrics)
    @property
    def latest_version(self) -> int | None:
        with self._lock:
            return self._order[-1] if self._order else None

    @property
    def latest_hash(self) -> str | None:
        with self._lock:
            return self._hashes[self._order[-1]] if self._order else None

    @property
    def versions(self) -> tuple[int, ...]:
        """Retained versions, oldest first."""
        with self._lock:
            return tuple(self._order)

    @property
    def snapshot_version(self) -> int | None:
        with self._lock:
            return None if self._snapshot is None else self._snapshot[0]

    def can_patch_from(self, held_version: int | None, held_hash: str | None) -> bool:
        """Could `update_for(held_version, held_hash)` serve a patch (whatever its size)? For a caller that sizes
        updates itself (the simulator's modelled sizes)."""
        with self._lock:
            return self._patch_chain(held_version, held_hash) is not None

    def _patch_chain(self, held_version: int | None, held_hash: str | None) -> list[int] | None:
        """The versions from the held one to the latest when a patch can go from there: the held version is
        retained with that hash, every patch record since is kept, and the chain is within `max_chain`; else None.
        The caller holds the lock."""
        if held_version not in self._hashes or held_hash is None or self._hashes[held_version] != held_hash:
            return None
        chain = self._order[self._order.index(held_version) :]
        if len(chain) - 1 > self.max_chain or not all(v in self._records for v in chain[1:]):
            return None
        return chain

    def patch_nbytes(self, version: int) -> int | None:
        """Size (as receivers download it) of the patch that produced `version`, None if none is retained."""
        with self._lock:
            return self._wire_nbytes.get(version) if version in self._records else None

    @property
    def nbytes(self) -> int:
        """Bytes held in patch records, the latest wire patch, the snapshot and cached merges (not counting the
        weight copies)."""
        with self._lock:
            held = sum(len(p) for p in self._records.values()) + sum(len(p) for p in self._merged.values())
            latest = self._records.get(self._order[-1]) if self._order else None
            if self._latest_wire is not None and self._latest_wire is not latest:
                held += len(self._latest_wire)
            return held + (len(self._snapshot[1]) if self._snapshot else 0)


class WeightReceiver:
    """Sampler side: holds weights, their version and hash; applies updates; asks for a snapshot on failure.

    Usage: `update = store.update_for(*receiver.held()); ok = receiver.apply(update)`. When `apply` returns
    False nothing was written: the weights are still the last verified version (or None), `last_error` says why,
    `refused` counts it, and `held()` returns (None, None) so the next update is a snapshot.

    With an `authority` (the learner's public key) it applies only updates whose every blob the learner signed, and
    that end no older than the newest (epoch, version) it applied (weights/signing.py); a refused one is counted in
    `refusals` by reason (unsigned, bad_signature, replayed) and leaves the held weights, still valid, as they are.
    """

    def __init__(
        self,
        weights: dict[str, torch.Tensor] | None = None,
        *,
        version: int | None = None,
        workers: int = 1,
        authority: Authority | None = None,
    ) -> None:
        self.weights = weights
        self.workers = workers  # threads decoding an update (weights.codec_threads)
        self.authority = authority
        self.newest_signed: tuple[int, int] | None = None  # (epoch, version) of the newest signed update applied
        self.refusals: dict[str, int] = {}  # signature refusals by reason
        self.version = version if weights is not None else None
        self.state_hash = state_hash(weights) if weights is not None and version is not None else None
        self.needs_snapshot = self.version is None
        self.last_error: str | None = None
        self.bytes_received = 0
        self.applied = 0  # updates applied
        self.refused = 0  # updates refused (weights untouched)

    def held(self) -> tuple[int | None, str | None]:
        """(version, hash) to send to the store; (None, None) when only a snapshot will do."""
        return (None, None) if self.needs_snapshot else (self.version, self.state_hash)

    def apply(self, update: Update) -> bool:
        """Apply a store update in place; True if the receiver now holds update.version with a verified hash.

        All or nothing (weights untouched on any refusal): both blobs (checksums, headers, their versions
        and hashes against the update's and against each other), the decoded result's hash, and its layout
        against the held weights. A snapshot (plus patch) is decoded into fresh tensors and copied in only then.
        """
        self.bytes_received += update.nbytes
        try:
            signed = self._authenticate(update)
        except SignatureError as err:  # what is held is still a version the learner signed: keep asking from it
            self.refusals[err.reason] = self.refusals.get(err.reason, 0) + 1
            self.last_error = str(err)
            self.refused += 1
            return False
        try:
            self._apply(update)
        except PatchError as err:
            self.needs_snapshot = True
            self.last_error = str(err)
            self.refused += 1
            return False
        self.version, self.state_hash = update.version, update.state_hash
        self.needs_snapshot = False
        self.last_error = None
        self.applied += 1
        if signed is not None:
            self.newest_signed = signed
        return True

    def _authenticate(self, update: Update) -> tuple[int, int] | None:
        """With an authority: every blob signed by the learner, and not older than what was applied; returns the
        update's (epoch, version). Raises SignatureError."""
        if self.authority is None:
            return None
        if not update.blobs:  # a noop changes nothing: nothing to sign
            return self.newest_signed
        self.authority.verify_blobs(update.blobs, update.signatures)
        assert update.signatures is not None
        ends = (update.signatures.epoch, update.version)
        if self.newest_signed is not None and ends < self.newest_signed:
            raise SignatureError(
                "replayed", f"update to epoch/version {ends} is older than {self.newest_signed}, already applied"
            )
        return ends

    def _apply(self, update: Update) -> None:
        snap = patch_info(update.snapshot) if update.snapshot is not None else None
        patch = patch_info(update.patch) if update.patch is not None else None
        if snap is not None and snap.kind != "snapshot":
            raise PatchError(f"update's snapshot is a {snap.kind}")
        if patch is not None and patch.kind != "patch":
            raise PatchError(f"update's patch is a {patch.kind}")
        if snap is None and patch is None:  # noop: must already hold it
            if self.needs_snapshot or (self.version, self.state_hash) != (update.version, update.state_hash):
                raise PatchError(f"empty update for version {update.version}, but holds {self.version}")
            return
        base_hash = snap.result_hash if snap is not None else self.state_hash
        if patch is not None and patch.base_hash != base_hash:
            raise PatchError(f"update's patch applies to {patch.base_hash}, not to {base_hash}")
        final = patch if patch is not None else snap
        assert final is not None
        if (final.result_version, final.result_hash) != (update.version, update.state_hash):
            raise PatchError(
                f"update promises {update.version}/{update.state_hash}, its blobs lead to "
                f"{final.result_version}/{final.result_hash}"
            )
        if update.snapshot is None:
            if self.weights is None or self.needs_snapshot:
                raise PatchError("received a patch but holds no verified weights")
            apply_patch(self.weights, update.patch, workers=self.workers)  # type: ignore[arg-type]  # all-or-nothing
            return
        staged = load_snapshot(update.snapshot, workers=self.workers)  # fresh tensors, hash-checked
        if update.patch is not None:
            apply_patch(staged, update.patch, workers=self.workers)
        if self.weights is None:
            self.weights = staged
            return
        held = {name: (t.dtype, tuple(t.shape)) for name, t in self.weights.items()}
        if held != {name: (t.dtype, tuple(t.shape)) for name, t in staged.items()}:
            raise PatchError("the update's weights have another layout than the held ones")
        for name, t in staged.items():
            self.weights[name].copy_(t)
