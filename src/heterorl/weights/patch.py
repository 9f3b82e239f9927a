"""PULSE patches: lossless sparse bf16 (any fixed-width dtype) weight updates, encoded, merged and applied.

A patch lists, per tensor, the flat positions whose raw bits changed and what they changed to. Positions are
stored as gaps between consecutive sorted flat indices (gap - 1, so 0 means adjacent); values are stored as
the exact integer difference new_bits - base_bits modulo 2^width, zigzagged and minus one (a changed element
never has difference 0). An Adam step of size lr moves a changed bf16 weight by one ULP, i.e. +-1 in its bits,
so values cost ~1 bit instead of 16. This is still "new raw values" in effect: the receiver's base is verified
by hash before anything is written, the arithmetic is integer and wraps exactly, so the result is bit-identical
and cannot drift; the result hash is checked on a scratch copy before the weights are touched. Both streams go
through `intcode` and zstd (module docstring there). Multi-step merges add differences at shared positions
(mod 2^width), which is exactly "newest value wins", and drop positions that changed back.

Payload of one tensor (one zstd frame, omitted when nothing changed): gap stream parts, then value stream parts.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xxhash

from heterorl.weights import hashing
from heterorl.weights.format import (
    UINT,
    PatchError,
    StateDict,
    TensorMeta,
    bits_view,
    check_matches,
    check_same_layout,
    get_hash,
    get_int,
    get_opt_int,
    pack,
    parallel_map,
    tensor_entries,
    tensor_header,
    unpack,
    writable_bits_view,
)
from heterorl.weights.intcode import StreamSpec, compress_parts, decode_uints, decompress_exact, encode_uints, uint_for

CHUNK = 1 << 18  # elements per pass step: keeps base, new and scratch chunks in L2 while diffing and hashing


@dataclass(frozen=True)
class PatchInfo:
    """What a patch or snapshot says about itself (header only, checksum verified)."""

    kind: str  # "patch" | "snapshot"
    base_hash: str | None  # None for snapshots
    result_hash: str
    base_version: int | None
    result_version: int | None
    changed: int  # elements a patch overwrites (numel for snapshots)
    numel: int  # elements in all tensors
    nbytes: int  # size of the whole blob


@dataclass(frozen=True)
class _TensorPatch:
    meta: TensorMeta
    count: int
    gaps: StreamSpec
    values: StreamSpec


@dataclass(frozen=True)
class _Header:
    base_hash: str
    result_hash: str
    base_version: int | None
    result_version: int | None
    tensors: list[_TensorPatch]


# --- integer helpers
def _zigzag_minus_one(delta_N: np.ndarray) -> np.ndarray:
    """Wrapped difference d (unsigned) -> zigzag(d) - 1: -1 -> 0, +1 -> 1, -2 -> 2, +2 -> 3, ...

    Unsigned arithmetic throughout (well defined on wrap-around); d is never 0 for a changed element.
    """
    bits = delta_N.dtype.itemsize * 8
    sign_N = delta_N >> (bits - 1)
    np.negative(sign_N, out=sign_N)  # 0 or all ones
    code_N = delta_N << 1
    code_N ^= sign_N
    code_N -= 1
    return code_N


def _unzigzag_plus_one(code_N: np.ndarray) -> np.ndarray:
    """Inverse of `_zigzag_minus_one` (in place on a copy of code_N + 1)."""
    zz_N = code_N + 1
    sign_N = zz_N & 1
    np.negative(sign_N, out=sign_N)
    zz_N >>= 1
    zz_N ^= sign_N
    return zz_N


# --- encode
def _encode_streams(pos_N: np.ndarray, delta_N: np.ndarray, numel: int, level: int) -> tuple[dict[str, Any], bytes]:
    """Gap + value streams of one tensor -> (header fields, zstd frame)."""
    gaps_N = np.diff(pos_N, prepend=-1)
    gaps_N -= 1
    gaps_N = gaps_N.astype(uint_for(numel))
    gap_spec, gap_parts = encode_uints(gaps_N)
    value_spec, value_parts = encode_uints(_zigzag_minus_one(delta_N))
    parts = gap_parts + value_parts
    fields = {
        "count": int(pos_N.size),
        "gaps": gap_spec.to_json(),
        "values": value_spec.to_json(),
        "raw_nbytes": sum(p.nbytes for p in parts),
    }
    return fields, compress_parts(parts, level)


def _diff_tensor(
    base_t: torch.Tensor, new_t: torch.Tensor, level: int, hash_base: bool, hash_new: bool
) -> tuple[dict[str, Any], bytes, bytes, bytes]:
    """Scan one tensor chunk by chunk (hashing while the chunk is in cache), then code its changes."""
    base_U = bits_view(base_t.detach())
    new_U = bits_view(new_t.detach())
    base_h, new_h = xxhash.xxh3_128(), xxhash.xxh3_128()
    found = []
    for start in range(0, base_U.size, CHUNK):
        b, n = base_U[start : start + CHUNK], new_U[start : start + CHUNK]
        if hash_base:
            base_h.update(b)
        if hash_new:
            new_h.update(n)
        idx = np.flatnonzero(b != n)
        if idx.size:
            found.append(idx + start)
    pos_N = np.concatenate(found) if found else np.zeros(0, np.int64)
    delta_N = new_U[pos_N] - base_U[pos_N]  # exact: unsigned arithmetic wraps mod 2^width
    fields, frame = _encode_streams(pos_N, delta_N, base_U.size, level)
    return fields, frame, base_h.digest(), new_h.digest()


def _assemble(
    layouts: Sequence[tuple[str, torch.dtype, tuple[int, ...]]],
    results: Sequence[tuple[dict[str, Any], bytes]],
    hashes: tuple[str, str],
    versions: tuple[int | None, int | None],
) -> bytes:
    entries, frames, offset = [], [], 0
    for (name, dtype, shape), (fields, frame) in zip(layouts, results, strict=True):
        entry = tensor_header(name, dtype, shape, offset, len(frame), fields.pop("raw_nbytes"))
        entry.update(fields)
        entries.append(entry)
        frames.append(frame)
        offset += len(frame)
    header = {
        "kind": "patch",
        "base_hash": hashes[0],
        "result_hash": hashes[1],
        "base_version": versions[0],
        "result_version": versions[1],
        "tensors": entries,
    }
    return pack(header, frames)


def encode_patch(
    base: StateDict,
    new: StateDict,
    *,
    level: int = 1,
    base_hash: str | None = None,
    new_hash: str | None = None,
    base_version: int | None = None,
    new_version: int | None = None,
    workers: int = 1,
) -> bytes:
    """Encode the lossless patch that turns `base` into `new` (same names, shapes, dtypes; CPU tensors).

    `base_hash` / `new_hash` skip hashing when the caller already knows them (the store does); they must be
    `state_hash` of the tensors, or every apply will fail its hash check. `workers` > 1 encodes tensors in
    threads (numpy and zstd release the GIL for most of the work).
    """
    check_same_layout(base, new)
    names = sorted(base)
    hash_base, hash_new = base_hash is None, new_hash is None
    diffs = parallel_map(lambda n: _diff_tensor(base[n], new[n], level, hash_base, hash_new), names, workers)
    if hash_base:
        base_hash = _combine(names, base, [d[2] for d in diffs])
    if hash_new:
        new_hash = _combine(names, new, [d[3] for d in diffs])
    assert base_hash is not None
    assert new_hash is not None
    layouts = [(n, base[n].dtype, tuple(base[n].shape)) for n in names]
    results = [(d[0], d[1]) for d in diffs]
    return _assemble(layouts, results, (base_hash, new_hash), (base_version, new_version))


def _combine(names: Sequence[str], tensors: StateDict, digests: Sequence[bytes]) -> str:
    entries = [(n, tensors[n].dtype, tuple(tensors[n].shape), d) for n, d in zip(names, digests, strict=True)]
    return hashing.combine(entries)


# --- parse / decode
def _parse(patch: bytes | bytearray | memoryview) -> tuple[_Header, memoryview]:
    blob = unpack(patch)
    header = blob.header
    if header.get("kind") != "patch":
        raise PatchError(f"expected a patch, got kind {header.get('kind')!r}")
    tensors = []
    for meta, entry in tensor_entries(header, len(blob.payload)):
        count = get_int(entry, "count", 0, meta.numel)
        gaps = StreamSpec.from_json(entry.get("gaps"), count, 64 if meta.numel >= 2**32 else 32)
        values = StreamSpec.from_json(entry.get("values"), count, meta.itemsize * 8)
        raw = sum(gaps.part_sizes(count)) + sum(values.part_sizes(count))
        if raw != meta.raw_nbytes:
            raise PatchError(f"tensor {meta.name!r}: raw_nbytes {meta.raw_nbytes} but its streams need {raw}")
        tensors.append(_TensorPatch(meta, count, gaps, values))
    parsed = _Header(
        base_hash=get_hash(header, "base_hash"),
        result_hash=get_hash(header, "result_hash"),
        base_version=get_opt_int(header, "base_version"),
        result_version=get_opt_int(header, "result_version"),
        tensors=tensors,
    )
    return parsed, blob.payload


def _decode_tensor(tp: _TensorPatch, payload: memoryview) -> tuple[np.ndarray, np.ndarray]:
    """(positions int64, wrapped bit differences uint) of one tensor, with every bound checked."""
    meta, count = tp.meta, tp.count
    value_dtype = UINT[meta.itemsize]
    if count == 0:
        decompress_exact(payload[meta.offset : meta.offset + meta.nbytes], 0, f"tensor {meta.name!r}")
        return np.zeros(0, np.int64), np.zeros(0, value_dtype)
    raw_U = decompress_exact(payload[meta.offset : meta.offset + meta.nbytes], meta.raw_nbytes, f"tensor {meta.name!r}")
    gap_nbytes = sum(tp.gaps.part_sizes(count))
    gaps_N = decode_uints(raw_U[:gap_nbytes], count, tp.gaps, uint_for(meta.numel))
    codes_N = decode_uints(raw_U[gap_nbytes:], count, tp.values, value_dtype)
    # Bounds: every gap < numel and the float sum <= numel rule out int64 overflow, then check exactly.
    if int(gaps_N.max()) >= meta.numel or float(gaps_N.sum(dtype=np.float64)) + count > meta.numel * (1 + 1e-9):
        raise PatchError(f"tensor {meta.name!r}: positions run past its {meta.numel} elements")
    gaps_N += 1  # cannot wrap: gap < numel <= the dtype's max
    pos_N = np.cumsum(gaps_N, dtype=np.int64)  # strictly increasing by construction (gap + 1 >= 1)
    pos_N -= 1
    if pos_N[-1] >= meta.numel:
        raise PatchError(f"tensor {meta.name!r}: position {int(pos_N[-1])} out of range [0, {meta.numel})")
    if (codes_N == np.iinfo(value_dtype).max).any():
        raise PatchError(f"tensor {meta.name!r}: a value code decodes to a zero change")
    return pos_N, _unzigzag_plus_one(codes_N)


def _patched_digests(base_U: np.ndarray, pos_N: np.ndarray, new_N: np.ndarray) -> tuple[bytes, bytes]:
    """Digests of the tensor before and after patching, computed chunk-wise on scratch (weights untouched)."""
    if pos_N.size == 0:
        digest = hashing.bits_digest(base_U)
        return digest, digest
    base_h, result_h = xxhash.xxh3_128(), xxhash.xxh3_128()
    scratch = np.empty(min(CHUNK, base_U.size), base_U.dtype)
    starts = np.arange(0, base_U.size + CHUNK, CHUNK)
    bounds = np.searchsorted(pos_N, starts)
    for i, start in enumerate(starts[:-1].tolist()):
        chunk = base_U[start : start + CHUNK]
        base_h.update(chunk)
        lo, hi = bounds[i], bounds[i + 1]
        if lo == hi:
            result_h.update(chunk)
            continue
        buf = scratch[: chunk.size]
        buf[...] = chunk
        buf[pos_N[lo:hi] - start] = new_N[lo:hi]
        result_h.update(buf)
    return base_h.digest(), result_h.digest()


def apply_patch(weights: StateDict, patch: bytes | bytearray | memoryview, *, workers: int = 1) -> None:
    """Apply a patch in place, or raise PatchError and leave `weights` untouched.

    Checked before the first write: magic, format version, lengths, checksum, header fields, tensor names,
    dtypes, shapes, counts, stream sizes, position bounds, the base hash of `weights`, and the result hash
    (computed on scratch chunks). Tensors must be contiguous CPU tensors (updated through a raw-bit view).
    """
    header, payload = _parse(patch)
    metas = [tp.meta for tp in header.tensors]
    check_matches(weights, metas)
    views = {m.name: writable_bits_view(weights[m.name], m.name) for m in metas}

    def prepare(tp: _TensorPatch) -> tuple[np.ndarray, np.ndarray, bytes, bytes]:
        pos_N, delta_N = _decode_tensor(tp, payload)
        base_U = views[tp.meta.name]
        new_N = base_U[pos_N] + delta_N
        return (pos_N, new_N, *_patched_digests(base_U, pos_N, new_N))

    prepared = parallel_map(prepare, header.tensors, workers)
    names = [m.name for m in metas]
    held = _combine(names, weights, [p[2] for p in prepared])
    if held != header.base_hash:
        raise PatchError(f"patch applies to base {header.base_hash} but the weights hash to {held}")
    result = _combine(names, weights, [p[3] for p in prepared])
    if result != header.result_hash:
        raise PatchError(f"patched weights would hash to {result}, the patch promises {header.result_hash}")
    for name, (pos_N, new_N, _, _) in zip(names, prepared, strict=True):
        views[name][pos_N] = new_N


def merge_patches(patches: Sequence[bytes | bytearray | memoryview], *, level: int = 1) -> bytes:
    """One patch equivalent to applying `patches` in order (each must start where the previous ended).

    Positions are the union; differences at shared positions add up modulo 2^width, which equals the newest
    value minus the oldest base (newest value wins), and positions whose bits came back are dropped.
    """
    if not patches:
        raise ValueError("merge_patches needs at least one patch")
    parsed = [_parse(p) for p in patches]
    if len(parsed) == 1:
        return bytes(patches[0])
    first = parsed[0][0]
    for (prev, _), (nxt, _) in itertools.pairwise(parsed):
        if prev.result_hash != nxt.base_hash:
            raise PatchError(f"patch chain is broken: {prev.result_hash} is followed by a patch for {nxt.base_hash}")
        if [t.meta.layout for t in prev.tensors] != [t.meta.layout for t in nxt.tensors]:
            raise PatchError("patches in a chain disagree on tensor names, dtypes or shapes")
    results = []
    for i, tp in enumerate(first.tensors):
        decoded = [_decode_tensor(h.tensors[i], payload) for h, payload in parsed]
        pos_all = np.concatenate([d[0] for d in decoded])
        order = np.argsort(pos_all, kind="stable")
        pos_sorted = pos_all[order]
        delta_sorted = np.concatenate([d[1] for d in decoded])[order].astype(np.uint64)
        starts = np.flatnonzero(np.r_[True, pos_sorted[1:] != pos_sorted[:-1]]) if pos_sorted.size else pos_sorted
        dtype = UINT[tp.meta.itemsize]
        delta_N = (np.add.reduceat(delta_sorted, starts) if starts.size else delta_sorted).astype(dtype)
        keep = delta_N != 0
        results.append(_encode_streams(pos_sorted[starts][keep], delta_N[keep], tp.meta.numel, level))
    last = parsed[-1][0]
    return _assemble(
        [tp.meta.layout for tp in first.tensors],
        results,
        (first.base_hash, last.result_hash),
        (first.base_version, last.result_version),
    )


def patch_info(blob: bytes | bytearray | memoryview) -> PatchInfo:
    """Read a patch's or snapshot's header (checksum verified) without decoding the payload."""
    parsed = unpack(blob)
    header = parsed.header
    kind = header.get("kind")
    entries = tensor_entries(header, len(parsed.payload))
    numel = sum(meta.numel for meta, _ in entries)
    if kind == "patch":
        changed = sum(get_int(entry, "count", 0, meta.numel) for meta, entry in entries)
        base_hash: str | None = get_hash(header, "base_hash")
        base_version = get_opt_int(header, "base_version")
    elif kind == "snapshot":
        changed, base_hash, base_version = numel, None, None
    else:
        raise PatchError(f"unknown blob kind {kind!r}")
    return PatchInfo(
        kind=kind,
        base_hash=base_hash,
        result_hash=get_hash(header, "result_hash"),
        base_version=base_version,
        result_version=get_opt_int(header, "result_version"),
        changed=changed,
        numel=numel,
        nbytes=len(memoryview(blob).cast("B")),
    )
