"""Weight updates on the wire: an explicit binary envelope around the store's `Update` (never pickle).

Layout (little-endian):

    magic b"HRLWUPD1" | u32 header length H | H bytes of JSON header | snapshot bytes | patch bytes

Header: {"version": int, "state_hash": str, "base_version": int | null, "kind": "snapshot" | "patch",
"snapshot_nbytes": int, "patch_nbytes": int}, and on a signed update {"epoch": int, "sigs": [hex, ...]}:
the learner's Ed25519 signature of each blob in body order, made in its epoch `epoch` (weights/signing.py; a
receiver holding the learner's key checks them, a decoder only their form). The body must be exactly
12 + H + snapshot_nbytes + patch_nbytes bytes. The snapshot and patch blobs carry their own checksums and
hashes, which the sampler's `WeightReceiver` verifies before it writes a single weight (docs/weight-sync.md).
`decode_update` also checks that the header agrees with the blobs' own (checksum-verified) headers: kinds, the
version and hash the update ends at, and that the patch starts where the snapshot ends, so a tampered envelope
is refused before any blob is applied. A "noop" update is never framed: the service answers 204 instead.
"""

from __future__ import annotations

import dataclasses
import re

from heterorl.framing import frame, frame_nbytes, non_negative_int, unframe
from heterorl.weights.format import PatchError
from heterorl.weights.patch import PatchInfo, patch_info
from heterorl.weights.signing import SIGNATURE_HEX, Signatures, Signer
from heterorl.weights.store import Update

MAGIC = b"HRLWUPD1"
MAX_HEADER_BYTES = 4096
_HASH = re.compile(r"^[0-9a-f]{1,128}$")
_SIG = re.compile(f"^[0-9a-f]{{{SIGNATURE_HEX}}}$")


class EnvelopeError(ValueError):
    """A weight-update envelope that cannot be parsed."""


def _header(update: Update) -> dict:
    if update.kind == "noop":
        raise ValueError("a noop update is not sent (the service answers 204)")
    header = {
        "version": update.version,
        "state_hash": update.state_hash,
        "base_version": update.base_version,
        "kind": update.kind,
        "snapshot_nbytes": len(update.snapshot or b""),
        "patch_nbytes": len(update.patch or b""),
    }
    if update.signatures is not None:
        header["epoch"] = update.signatures.epoch
        header["sigs"] = list(update.signatures.blobs)
    return header


def sign_update(update: Update, signer: Signer | None) -> Update:
    """`update` with the learner's signatures of its blobs (unchanged without a signer: trust is not configured)."""
    if signer is None or update.kind == "noop":
        return update
    return dataclasses.replace(update, signatures=signer.sign_blobs(update.snapshot, update.patch))


def encode_update(update: Update) -> bytes:
    """Frame a snapshot and/or patch update (not a noop)."""
    return frame(MAGIC, _header(update), (update.snapshot or b"") + (update.patch or b""))


def envelope_nbytes(update: Update) -> int:
    """len(encode_update(update)), without copying the payload: what the update costs on the wire."""
    return frame_nbytes(MAGIC, _header(update)) + update.nbytes


def _int_field(header: dict, key: str) -> int:
    return non_negative_int(header, key, EnvelopeError)


def decode_update(data: bytes) -> Update:
    """Parse an envelope into an `Update`; raises EnvelopeError on anything malformed."""
    header, start = unframe(data, MAGIC, MAX_HEADER_BYTES, EnvelopeError)
    version = _int_field(header, "version")
    base_version = None if header.get("base_version") is None else _int_field(header, "base_version")
    n_snap, n_patch = _int_field(header, "snapshot_nbytes"), _int_field(header, "patch_nbytes")
    state_hash, kind = header.get("state_hash"), header.get("kind")
    if not isinstance(state_hash, str) or not _HASH.match(state_hash):
        raise EnvelopeError(f"header field 'state_hash' must be a hex digest, got {state_hash!r}")
    if (kind, n_snap > 0) not in (("snapshot", True), ("patch", False)) or (kind == "patch" and n_patch == 0):
        raise EnvelopeError(f"kind {kind!r} does not match snapshot {n_snap} / patch {n_patch} bytes")
    if len(data) != start + n_snap + n_patch:
        raise EnvelopeError(f"envelope has {len(data)} bytes, its header declares {start + n_snap + n_patch}")
    update = Update(
        version=version,
        state_hash=state_hash,
        base_version=base_version,
        snapshot=data[start : start + n_snap] if n_snap else None,
        patch=data[start + n_snap :] if n_patch else None,
        signatures=_signatures(header, (n_snap > 0) + (n_patch > 0)),
    )
    _check_blobs(update)
    return update


def _signatures(header: dict, n_blobs: int) -> Signatures | None:
    """The header's signatures, checked for form only (the receiver's authority checks what they sign)."""
    if "sigs" not in header and "epoch" not in header:
        return None
    sigs = header.get("sigs")
    if (
        not isinstance(sigs, list)
        or len(sigs) != n_blobs
        or not all(isinstance(x, str) and _SIG.match(x) for x in sigs)
    ):
        raise EnvelopeError(f"header field 'sigs' must list {n_blobs} signatures of {SIGNATURE_HEX} hex digits")
    return Signatures(_int_field(header, "epoch"), tuple(sigs))


def _blob_info(blob: bytes, kind: str) -> PatchInfo:
    try:
        info = patch_info(blob)
    except (PatchError, ValueError, RecursionError, OverflowError) as err:  # what parsing hostile bytes raises
        raise EnvelopeError(f"{kind}: {type(err).__name__}: {str(err)[:200]}") from None
    if info.kind != kind:
        raise EnvelopeError(f"the {kind} blob is a {info.kind}")
    return info


def _check_blobs(update: Update) -> None:
    """The header must say what the (checksum-verified) blob headers say: where the update starts and ends."""
    snap = None if update.snapshot is None else _blob_info(update.snapshot, "snapshot")
    patch = None if update.patch is None else _blob_info(update.patch, "patch")
    last = patch or snap
    assert last is not None, "decode_update frames a snapshot or a patch"
    if (last.result_version, last.result_hash) != (update.version, update.state_hash):
        raise EnvelopeError(
            f"header promises version {update.version} / {update.state_hash[:16]}, the blobs end at "
            f"{last.result_version} / {last.result_hash[:16]}"
        )
    if patch is not None:
        start = (patch.base_version, patch.base_hash)
        if snap is not None and start != (snap.result_version, snap.result_hash):
            raise EnvelopeError("the patch does not start where the snapshot ends")
        if snap is None and patch.base_version != update.base_version:
            raise EnvelopeError(f"header base version {update.base_version}, the patch's {patch.base_version}")
