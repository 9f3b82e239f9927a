"""End-to-end identity of a set of weights: xxh3-128 over tensors in sorted name order.

The hash is two-level: each tensor's raw bytes get an xxh3-128 digest, and the state hash is xxh3-128 over, for
each tensor in sorted name order, a descriptor (name, dtype, shape; length-prefixed so no two layouts collide)
followed by that tensor's 16-byte digest. Compared with one stream over all bytes this costs nothing extra but
lets encoder and decoder hash tensor by tensor (in parallel, and fused with the pass that diffs or patches them,
while the chunk is still in cache). xxh3 runs at tens of GB/s and catches transmission and encoder errors; it is
not a defence against a malicious publisher (that needs a signature or a cryptographic hash).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import torch
import xxhash

from heterorl.weights.format import StateDict, bits_view

_DOMAIN = b"heterorl-state-hash-v1"


def descriptor(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> bytes:
    """Unambiguous bytes naming a tensor's name, dtype and shape."""
    name_b = name.encode()
    dtype_b = str(dtype).encode()
    return b"".join(
        (
            struct.pack("<I", len(name_b)),
            name_b,
            struct.pack("<B", len(dtype_b)),
            dtype_b,
            struct.pack("<B", len(shape)),
            struct.pack(f"<{len(shape)}q", *shape),
        )
    )


def bits_digest(bits: np.ndarray) -> bytes:
    """xxh3-128 digest of a tensor's raw bits (flat numpy view)."""
    return xxhash.xxh3_128(bits).digest()


def patched_digests(
    base_U: np.ndarray,
    runs: Sequence[tuple[np.ndarray, np.ndarray]],
    chunk: int = 1 << 18,
    base_digest: bytes | None = None,
) -> tuple[bytes, bytes]:
    """Digests of a tensor's bits before and after writing each run's values at its positions (each run's
    positions sorted and distinct, runs disjoint), without touching base_U. A known `base_digest` is not
    recomputed.

    Chunk by chunk: the chunk is hashed, copied to a cache-resident scratch buffer, patched there and hashed
    again, so base, scratch and both hashes stay in L2; no copy of the whole tensor is made.
    """
    runs = [r for r in runs if r[0].size]
    if not runs:
        digest = base_digest or bits_digest(base_U)
        return digest, digest
    base_h = None if base_digest is not None else xxhash.xxh3_128()
    result_h = xxhash.xxh3_128()
    scratch = np.empty(min(chunk, base_U.size), base_U.dtype)
    starts = np.arange(0, base_U.size + chunk, chunk)
    cuts = [np.searchsorted(pos, starts).tolist() for pos, _ in runs]
    for i, start in enumerate(starts[:-1].tolist()):
        part = base_U[start : start + chunk]
        if base_h is not None:
            base_h.update(part)
        touched = [(pos, new, c[i], c[i + 1]) for (pos, new), c in zip(runs, cuts, strict=True) if c[i] < c[i + 1]]
        if not touched:
            result_h.update(part)
            continue
        buf = scratch[: part.size]
        np.copyto(buf, part)
        for pos, new, lo, hi in touched:
            buf[pos[lo:hi] - start] = new[lo:hi]
        result_h.update(buf)
    return (base_digest if base_h is None else base_h.digest()), result_h.digest()


def combine(entries: list[tuple[str, torch.dtype, tuple[int, ...], bytes]]) -> str:
    """State hash from (name, dtype, shape, tensor digest) entries, which must already be in sorted name order."""
    hasher = xxhash.xxh3_128(_DOMAIN)
    for name, dtype, shape, digest in entries:
        hasher.update(descriptor(name, dtype, shape))
        hasher.update(digest)
    return hasher.hexdigest()


def state_hash(weights: StateDict) -> str:
    """xxh3-128 hex digest identifying `weights` bit for bit (names, dtypes, shapes and raw bytes)."""
    entries = []
    for name in sorted(weights):
        t = weights[name]
        entries.append((name, t.dtype, tuple(t.shape), bits_digest(bits_view(t.detach().cpu()))))
    return combine(entries)
