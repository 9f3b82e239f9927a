"""PULSE patches: lossless sparse weight updates (any fixed-width dtype), encoded, merged, re-coded and applied.

A patch lists, per tensor, the flat positions whose raw bits changed and the exact wrapped bit difference
new_bits - base_bits. Two tensor layouts share one container (format.py):

* format version 1 (`plain.py`): one gap stream and one value stream per tensor, or, for a tensor most of whose
  elements changed, one stream of every element's code with no positions (`dense.py`; the learner's diff decides
  per tensor from a sample and then computes the codes and the hashes in one pass);
* format version 2 (`ctxpatch.py`, `context=True`): the same information coded per magnitude class of the base
  weights, which the receiver holds, so each class gets its own statistics: 25-40% fewer bytes on real AdamW
  steps (docs/weight-sync.md).

Either way the result is bit-identical and cannot drift: the arithmetic is integer and wraps exactly, and the
result hash is checked as the changes are written, which are reverted exactly if it (or anything) fails. The
result hash covers every element, so it matches only if the receiver held the patch's base (an element that
differed there would differ in the result) and every change decoded as it was coded; the base hash is computed
when a check fails, to say which of the two went wrong. Multi-step merges add differences at shared positions
(mod 2^width), which is exactly "newest value wins", and drop positions that changed back. A v2 patch can only be
decoded against its base, so merges work on v1 patches and `recode_patch` turns a (merged) v1 patch into v2 given
the weights it produces.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from heterorl.weights import ctxpatch, dense, hashing, plain, staged
from heterorl.weights.diffscan import int_view, scan_cpu, scan_device
from heterorl.weights.format import (
    CTX_FORMAT_VERSION,
    FORMAT_VERSION,
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
    read_bits_view,
    tensor_entries,
    tensor_header,
    unpack,
    writable_bits_view,
)
from heterorl.weights.intcode import zigzag_minus_one

Blobish = bytes | bytearray | memoryview
DEVICE_PATH_ON_CPU = False  # tests set it to run the accelerator encode path (torch ops) on CPU tensors


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
    format_version: int = FORMAT_VERSION


@dataclass(frozen=True)
class _Header:
    base_hash: str
    result_hash: str
    base_version: int | None
    result_version: int | None
    tensors: list[TensorMeta]  # layouts, in name order
    plain: list[plain.PlainTensor]  # v1: one entry per tensor
    segments: list[ctxpatch.Segment]  # v2
    counts: list[int]  # changed elements per tensor
    version: int


# --- encode
def _patch_header(
    hashes: tuple[str, str], versions: tuple[int | None, int | None], layout: dict[str, Any]
) -> dict[str, Any]:
    """The header of a patch in either format: base and result identities, then the format's own layout."""
    return {
        "kind": "patch",
        "base_hash": hashes[0],
        "result_hash": hashes[1],
        "base_version": versions[0],
        "result_version": versions[1],
        **layout,
    }


def _assemble(
    layouts: Sequence[tuple[str, torch.dtype, tuple[int, ...]]],
    results: Sequence[tuple[dict[str, Any], bytes]],
    hashes: tuple[str, str],
    versions: tuple[int | None, int | None],
    format_version: int,
) -> bytes:
    entries, frames, offset = [], [], 0
    for (name, dtype, shape), (fields, frame) in zip(layouts, results, strict=True):
        entry = tensor_header(name, dtype, shape, offset, len(frame), fields.pop("raw_nbytes"))
        entry.update(fields)
        entries.append(entry)
        frames.append(frame)
        offset += len(frame)
    return pack(_patch_header(hashes, versions, {"tensors": entries}), frames, format_version)


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
    context: bool = False,
) -> bytes:
    """Encode the lossless patch that turns `base` into `new` (same names, shapes, dtypes, devices).

    `context=True` writes format version 2 (changes coded per magnitude class of the base), else version 1.
    `base_hash` / `new_hash` skip hashing when the caller already knows them (the store does); they must be
    `state_hash` of the tensors, or every apply will fail its hash check. `workers` > 1 encodes tensors in
    threads (numpy, xxhash and zstd release the GIL for most of the work). Tensors on an accelerator are diffed
    there (diffscan.py).
    """
    hashes, versions = (base_hash, new_hash), (base_version, new_version)
    v1, v2 = encode_patches(
        base,
        new,
        level=level,
        hashes=hashes,
        versions=versions,
        workers=workers,
        formats=(CTX_FORMAT_VERSION,) if context else (FORMAT_VERSION,),
    )
    out = v2 if context else v1
    assert out is not None
    return out


def encode_patches(
    base: StateDict,
    new: StateDict,
    *,
    level: int = 1,
    hashes: tuple[str | None, str | None] = (None, None),
    versions: tuple[int | None, int | None] = (None, None),
    workers: int = 1,
    formats: Sequence[int] = (FORMAT_VERSION, CTX_FORMAT_VERSION),
) -> tuple[bytes | None, bytes | None]:
    """(v1 patch, v2 patch) from one diff of `base` and `new`, each only if its format version is in `formats`
    (None otherwise). See `encode_patch` for the arguments."""
    out = encode_versions(base, new, level=level, hashes=hashes, versions=versions, workers=workers, formats=formats)
    return out.v1, out.v2


@dataclass(frozen=True)
class Encoded:
    """What `encode_versions` produced: the patches asked for (None when not asked for, or when skipped), the two
    state hashes, the changed elements and the patch size estimated from them before any coding."""

    v1: bytes | None
    v2: bytes | None
    base_hash: str
    new_hash: str
    changed: int
    estimated_nbytes: int
    skipped: bool  # the estimate exceeded `max_nbytes`: nothing was coded


def encode_versions(
    base: StateDict,
    new: StateDict,
    *,
    level: int = 1,
    hashes: tuple[str | None, str | None] = (None, None),
    versions: tuple[int | None, int | None] = (None, None),
    workers: int = 1,
    formats: Sequence[int] = (FORMAT_VERSION, CTX_FORMAT_VERSION),
    max_nbytes: int | None = None,
) -> Encoded:
    """`encode_patches`, deciding after the diff scan whether coding pays: when the patch size estimated from the
    scan's change counts (`estimate_nbytes`) exceeds `max_nbytes`, no patch is coded (`skipped`; the caller
    sends a snapshot). The hashes come from the same scan either way."""
    check_same_layout(base, new)
    names = sorted(base)
    base_hash, new_hash = hashes
    hash_base, hash_new = base_hash is None, new_hash is None
    dense_ok = tuple(formats) == (FORMAT_VERSION,)  # a v2 patch codes every change by its class: it needs them all

    def scan_one(name: str) -> _Diff:
        b, n = base[name], new[name]
        if _on_device(b):
            if dense_ok and dense.is_dense_device(b, n):
                codes, count, db, dn = dense.scan_device(b, n, hash_base, hash_new)
                return _Diff(None, None, db, dn, codes, count)
            return _Diff(*scan_device(b, n, hash_base, hash_new))
        base_U, new_U = read_bits_view(b), read_bits_view(n)
        if dense_ok and dense.is_dense(base_U, new_U):
            codes, count, db, dn = dense.scan(base_U, new_U, hash_base, hash_new)
            return _Diff(None, None, db, dn, codes, count)
        return _Diff(*scan_cpu(base_U, new_U, hash_base, hash_new))

    diffs = parallel_map(scan_one, names, workers)
    if hash_base:
        base_hash = _combine(names, base, [d.base_digest for d in diffs])
    if hash_new:
        new_hash = _combine(names, new, [d.new_digest for d in diffs])
    assert base_hash is not None
    assert new_hash is not None
    layouts = [(n, base[n].dtype, tuple(base[n].shape)) for n in names]
    numels = [base[n].numel() for n in names]
    sparse = [i for i, d in enumerate(diffs) if d.codes is None]
    estimate = estimate_nbytes([diffs[i].changes for i in sparse], [numels[i] for i in sparse]) + sum(
        dense.estimate_nbytes(d.codes) + PATCH_OVERHEAD for d in diffs if d.codes is not None
    )
    changed = sum(d.count for d in diffs)
    if max_nbytes is not None and estimate > max_nbytes:
        return Encoded(None, None, base_hash, new_hash, changed, estimate, True)
    v1 = v2 = None
    if CTX_FORMAT_VERSION in formats:
        base_bits = [_base_bits(base[n]) for n in names]
        changes = [d.changes for d in diffs]
        v2 = _assemble_v2(layouts, base_bits, changes, (base_hash, new_hash), versions, level, workers)
    if FORMAT_VERSION in formats:

        def code_one(i: int) -> tuple[dict[str, Any], bytes]:
            d = diffs[i]
            if d.codes is not None:
                return dense.encode(d.codes, d.count, level)
            return plain.encode_tensor(*d.changes, numels[i], level, is_dense=False if dense_ok else None)

        v1 = _assemble(
            layouts,
            parallel_map(code_one, list(range(len(names))), workers),
            (base_hash, new_hash),
            versions,
            FORMAT_VERSION,
        )
    return Encoded(v1, v2, base_hash, new_hash, changed, estimate, False)


@dataclass
class _Diff:
    """One tensor's diff: its changes (sparse), or every element's code and the count of changes (dense)."""

    pos: np.ndarray | None
    delta: np.ndarray | None
    base_digest: bytes
    new_digest: bytes
    codes: np.ndarray | None = None
    dense_count: int = 0

    @property
    def changes(self) -> tuple[np.ndarray, np.ndarray]:
        assert self.pos is not None, "a dense tensor's changes are in its codes"
        assert self.delta is not None
        return self.pos, self.delta

    @property
    def count(self) -> int:
        return self.dense_count if self.pos is None else int(self.pos.size)


PATCH_OVERHEAD = 64  # bytes per tensor in a patch (header entry, zstd frame), measured ~50
_VALUE_SAMPLE = 1 << 14  # value codes looked at (strided over all tensors) for the value-entropy estimate
_VALUE_BINS = 1 << 12  # codes this large or larger share a bin (they cost ~12+ bits either way)


def estimate_nbytes(changes: Sequence[tuple[np.ndarray, np.ndarray]], numels: Sequence[int]) -> int:
    """A patch's size estimated from a diff, before coding: positions n h(k / n) bits per tensor (k changes of
    n elements; independent positions, which v1 codes within a few percent of), values at the empirical entropy
    of a strided sample of all value codes (large codes binned together), plus PATCH_OVERHEAD per tensor."""
    counts = np.array([c[0].size for c in changes], np.float64)
    n = np.maximum(np.array(numels, np.float64), 1.0)
    p = counts / n
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -(p * np.log2(np.where(p > 0, p, 1.0)) + (1 - p) * np.log2(np.where(p < 1, 1 - p, 1.0)))
    position_bits = float((n * h).sum())
    total = int(counts.sum())
    value_bits = 0.0
    if total:
        step = max(1, total // _VALUE_SAMPLE)
        by_width: dict[np.dtype, list[np.ndarray]] = {}  # one zigzag per width, not per tensor
        for c in changes:
            if c[1].size:
                by_width.setdefault(c[1].dtype, []).append(c[1][::step])
        codes = np.concatenate([zigzag_minus_one(np.concatenate(s)).astype(np.uint64) for s in by_width.values()])
        big = codes >= _VALUE_BINS - 1  # these share a bin and cost their own bits on top
        hist = np.bincount(np.minimum(codes, _VALUE_BINS - 1).astype(np.intp), minlength=_VALUE_BINS)
        q = hist[hist > 0] / codes.size
        raw_bits = float(np.log2(codes[big].astype(np.float64) + 1.0).sum()) / codes.size
        value_bits = total * (float(-(q * np.log2(q)).sum()) + raw_bits)
    return int((position_bits + value_bits) / 8) + PATCH_OVERHEAD * len(numels)


def _on_device(t: torch.Tensor) -> bool:
    return t.device.type != "cpu" or DEVICE_PATH_ON_CPU


def _base_bits(t: torch.Tensor) -> np.ndarray | torch.Tensor:
    """A tensor's raw bits for the v2 encoder: a host view, or a flat integer view where the tensor lives."""
    return int_view(t) if _on_device(t) else read_bits_view(t)


def _assemble_v2(
    layouts: Sequence[tuple[str, torch.dtype, tuple[int, ...]]],
    base_bits: Sequence[np.ndarray],
    changes: Sequence[tuple[np.ndarray, np.ndarray]],
    hashes: tuple[str, str],
    versions: tuple[int | None, int | None],
    level: int,
    workers: int,
) -> bytes:
    fields, frames = ctxpatch.encode(layouts, base_bits, changes, level, workers)
    return pack(_patch_header(hashes, versions, fields), frames, CTX_FORMAT_VERSION)


def _combine(names: Sequence[str], tensors: StateDict, digests: Sequence[bytes]) -> str:
    entries = [(n, tensors[n].dtype, tuple(tensors[n].shape), d) for n, d in zip(names, digests, strict=True)]
    return hashing.combine(entries)


# --- parse / decode
def _parse(patch: Blobish) -> tuple[_Header, memoryview]:
    blob = unpack(patch)
    header = blob.header
    if header.get("kind") != "patch":
        raise PatchError(f"expected a patch, got kind {header.get('kind')!r}")
    plains: list[plain.PlainTensor] = []
    segments: list[ctxpatch.Segment] = []
    if blob.version == CTX_FORMAT_VERSION:
        metas, counts, segments = ctxpatch.parse(header, len(blob.payload))
    else:
        plains = [plain.parse_tensor(meta, entry) for meta, entry in tensor_entries(header, len(blob.payload))]
        metas, counts = [t.meta for t in plains], [t.count for t in plains]
    parsed = _Header(
        base_hash=get_hash(header, "base_hash"),
        result_hash=get_hash(header, "result_hash"),
        base_version=get_opt_int(header, "base_version"),
        result_version=get_opt_int(header, "result_version"),
        tensors=metas,
        plain=plains,
        segments=segments,
        counts=counts,
        version=blob.version,
    )
    return parsed, blob.payload


def _units_v1(header: _Header, payload: memoryview) -> list[staged.Unit]:
    def unit(i: int) -> staged.Unit:
        plain_tensor = header.plain[i]
        return staged.Unit(i, 1, plain_tensor.meta.numel, lambda threads: [[plain_tensor.decode(payload)]])

    return [unit(i) for i in range(len(header.plain))]


def apply_patch(weights: StateDict, patch: Blobish, *, workers: int = 1) -> None:
    """Apply a patch (format version 1 or 2) in place, or raise PatchError and leave `weights` untouched.

    Checked before the first write: magic, format version, lengths, checksum, header fields, tensor names,
    dtypes, shapes, counts and stream sizes; per tensor as it is decoded: position bounds and class sizes (v2).
    Then the changes are written tensor by tensor, each hashed as it is written (staged.py), and the result hash,
    which only the patch's base with every change decoded right can produce, is compared with the patch's. On any
    failure every tensor written is reverted exactly (the wrapped differences subtracted again), and a base that
    is not the patch's is what the error names. Tensors must be contiguous CPU tensors (updated through a raw-bit
    view), and nothing else may read them during the call. `workers` threads decode and hash tensors side by side.
    """
    header, payload = _parse(patch)
    metas = header.tensors
    check_matches(weights, metas)
    names = [m.name for m in metas]
    views = [writable_bits_view(weights[m.name], m.name) for m in metas]
    _check_disjoint(names, [weights[n] for n in names])
    if header.version == CTX_FORMAT_VERSION:
        units = ctxpatch.units(header.segments, header.counts, views, payload)
    else:
        units = _units_v1(header, payload)
    try:
        applied = staged.apply_all(units, views, workers)  # reverts what it wrote if it raises
    except PatchError:
        _check_base(header.base_hash, weights)  # a v2 patch decoded against another base, most likely
        raise
    try:
        result = _combine(names, weights, applied.result_digests)
    except BaseException:
        applied.revert()
        raise
    if result != header.result_hash:
        applied.revert()
        _check_base(header.base_hash, weights)
        raise PatchError(f"patched weights would hash to {result}, the patch promises {header.result_hash}")


def _check_disjoint(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> None:
    """PatchError if two tensors share memory (a tied weight listed twice): written in place, the shared elements
    would get their differences twice. Sorted by start, any overlap shows between neighbours."""
    spans = sorted(
        (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), n)
        for n, t in zip(names, tensors, strict=True)
        if t.numel()
    )
    for (_, end, first), (start, _, second) in itertools.pairwise(spans):
        if start < end:
            raise PatchError(
                f"tensors {first!r} and {second!r} share memory; patches are applied in place, so give each weight "
                "its own tensor (named_parameters lists a tied weight once)"
            )


def _check_base(base_hash: str, weights: StateDict) -> None:
    """PatchError naming the weights' hash if it is not the patch's base (a failed apply's likeliest cause)."""
    held = hashing.state_hash(weights)
    if held != base_hash:
        raise PatchError(f"patch applies to base {base_hash} but the weights hash to {held}")


# --- merge and re-code
def merge_patches(patches: Sequence[Blobish], *, level: int = 1) -> bytes:
    """One v1 patch equivalent to applying v1 `patches` in order (each must start where the previous ended).

    Positions are the union; differences at shared positions add up modulo 2^width, which equals the newest
    value minus the oldest base (newest value wins), and positions whose bits came back are dropped.
    """
    if not patches:
        raise ValueError("merge_patches needs at least one patch")
    parsed = [_parse(p) for p in patches]
    if any(h.version != FORMAT_VERSION for h, _ in parsed):
        raise PatchError("only v1 patches can be merged (a v2 patch decodes only against its base)")
    if len(parsed) == 1:
        return bytes(patches[0])
    first = parsed[0][0]
    for (prev, _), (nxt, _) in itertools.pairwise(parsed):
        if prev.result_hash != nxt.base_hash:
            raise PatchError(f"patch chain is broken: {prev.result_hash} is followed by a patch for {nxt.base_hash}")
        if [t.layout for t in prev.tensors] != [t.layout for t in nxt.tensors]:
            raise PatchError("patches in a chain disagree on tensor names, dtypes or shapes")
    results = []
    for i, meta in enumerate(first.tensors):
        decoded = [h.plain[i].decode(payload) for h, payload in parsed]
        results.append(plain.encode_tensor(*_sum_changes(decoded, meta.itemsize), meta.numel, level))
    last = parsed[-1][0]
    return _assemble(
        [t.layout for t in first.tensors],
        results,
        (first.base_hash, last.result_hash),
        (first.base_version, last.result_version),
        FORMAT_VERSION,
    )


def _sum_changes(decoded: Sequence[tuple[np.ndarray, np.ndarray]], itemsize: int) -> tuple[np.ndarray, np.ndarray]:
    """Union of positions, differences summed mod 2^width at shared ones, zero sums dropped (sorted)."""
    pos_all = np.concatenate([d[0] for d in decoded])
    order = np.argsort(pos_all, kind="stable")
    pos_sorted = pos_all[order]
    delta_sorted = np.concatenate([d[1] for d in decoded])[order].astype(np.uint64)
    starts = np.flatnonzero(np.r_[True, pos_sorted[1:] != pos_sorted[:-1]]) if pos_sorted.size else pos_sorted
    delta_K = (np.add.reduceat(delta_sorted, starts) if starts.size else delta_sorted).astype(UINT[itemsize])
    keep = delta_K != 0
    return pos_sorted[starts][keep], delta_K[keep]


def recode_patch(patch: Blobish, result: StateDict, *, level: int = 1, workers: int = 1) -> bytes:
    """The v2 (context-coded) form of a v1 patch, given the weights it produces (e.g. the store's latest).

    The base is rebuilt tensor by tensor as result - difference at the changed positions; both the result and
    the rebuilt base are checked against the patch's hashes, so a wrong `result` raises PatchError.
    """
    header, payload = _parse(patch)
    if header.version != FORMAT_VERSION:
        raise PatchError("recode_patch takes a v1 patch")
    check_matches(result, header.tensors)

    def one(i: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray], bytes, bytes]:
        pos_K, delta_K = header.plain[i].decode(payload)
        result_U = bits_view(result[header.tensors[i].name].detach().cpu())
        base_U = result_U.copy()
        base_U[pos_K] -= delta_K
        return base_U, (pos_K, delta_K), hashing.bits_digest(base_U), hashing.bits_digest(result_U)

    rebuilt = parallel_map(one, list(range(len(header.tensors))), workers)
    layouts = [t.layout for t in header.tensors]
    if hashing.combine([(*lay, r[3]) for lay, r in zip(layouts, rebuilt, strict=True)]) != header.result_hash:
        raise PatchError("recode_patch: the weights given are not the patch's result")
    if hashing.combine([(*lay, r[2]) for lay, r in zip(layouts, rebuilt, strict=True)]) != header.base_hash:
        raise PatchError("recode_patch: result minus the patch does not hash to the patch's base")
    return _assemble_v2(
        layouts,
        [r[0] for r in rebuilt],
        [r[1] for r in rebuilt],
        (header.base_hash, header.result_hash),
        (header.base_version, header.result_version),
        level,
        workers,
    )


def revert_patch(weights: StateDict, patch: Blobish) -> None:
    """Undo a v1 patch in place: `weights`, which must be its result, become its base (base = result - difference
    at the changed positions, mod 2^width). The caller checks the base's hash if it needs to (the store does).
    A verifier rebuilds older versions this way, walking back from the newest (WeightStore.weights_at)."""
    header, payload = _parse(patch)
    if header.version != FORMAT_VERSION:
        raise PatchError("revert_patch takes a v1 patch")
    check_matches(weights, header.tensors)
    for meta, tensor in zip(header.tensors, header.plain, strict=True):
        pos_K, delta_K = tensor.decode(payload)
        view = writable_bits_view(weights[meta.name], meta.name)
        view[pos_K] -= delta_K


def patch_info(blob: Blobish) -> PatchInfo:
    """Read a patch's or snapshot's header (checksum verified) without decoding the payload."""
    parsed = unpack(blob)
    header = parsed.header
    kind = header.get("kind")
    if kind == "patch" and parsed.version == CTX_FORMAT_VERSION:
        metas, counts, _ = ctxpatch.parse(header, len(parsed.payload))
        numel, changed = sum(m.numel for m in metas), sum(counts)
    else:
        entries = tensor_entries(header, len(parsed.payload))
        numel = sum(meta.numel for meta, _ in entries)
        changed = sum(get_int(entry, "count", 0, meta.numel) for meta, entry in entries) if kind == "patch" else numel
    if kind == "patch":
        base_hash: str | None = get_hash(header, "base_hash")
        base_version = get_opt_int(header, "base_version")
    elif kind == "snapshot" and parsed.version == FORMAT_VERSION:
        base_hash, base_version = None, None
    else:
        raise PatchError(f"unknown blob kind {kind!r} for format version {parsed.version}")
    return PatchInfo(
        kind=kind,
        base_hash=base_hash,
        result_hash=get_hash(header, "result_hash"),
        base_version=base_version,
        result_version=get_opt_int(header, "result_version"),
        changed=changed,
        numel=numel,
        nbytes=len(memoryview(blob).cast("B")),
        format_version=parsed.version,
    )
