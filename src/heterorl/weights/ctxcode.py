"""PULSE v2 stream coding of one segment (a tensor, or a few small tensors' bits concatenated) by magnitude class.

The changes are the same as in v1 (changed = raw bits differ; value code = zigzag(new - base mod 2^width) - 1)
but coded per magnitude class of the base (`classes.py`), class c = 0 (smallest |bits|) .. K-1 (the top class):

* positions of class c's changes:
  - classes below the top by rank among the class's members (members in flat order), the top class by flat
    position (no enumeration of the bulk of the tensor; every decoded top-class position must be a member);
  - "gaps" mode: g_i = r_i - r_(i-1) - 1 (r_(-1) = -1) through `intcode`, or
    "bitmap" mode: one bit per member (per element for the top class), 1 = changed, least significant bit
    first; dense classes decode without gap arithmetic and zstd's Huffman stage codes the bytes near their
    entropy;
* value codes of class c's changes, in the same order: "bits" mode when every code is 0 or 1 (a +-1 ULP step:
  one raw bit each, no Huffman table), else "int" mode through `intcode`.

Frame: one zstd frame of [class 0 position parts][class 0 value parts][class 1 ...], a block boundary after
every part. Segment header fields: `count`, `bounds` (K - 1 strictly increasing magnitudes), `classes`: K
entries {"n": count, "m": members (below the top only; checked against the receiver's own enumeration),
"p": position mode, "g": gap spec [k, escapes, escape_width], "v": value mode, "x": value spec}.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from heterorl.weights import native
from heterorl.weights.classes import (
    MANTISSA_BITS,
    MAX_CLASSES,
    PARALLEL_MIN,
    choose_bounds,
    class_flags_torch,
    histograms,
    magnitude_mask,
    magnitudes,
    members,
    sample_stride,
)
from heterorl.weights.format import UINT, PatchError, get_int, parallel_map
from heterorl.weights.intcode import (
    DIFFERENCES,
    StreamSpec,
    compress_parts,
    decode_uints,
    decode_values,
    decompress_exact,
    encode_stream,
    encode_uints,
    uint_for,
    unit_steps,
    zigzag_minus_one,
)
from heterorl.weights.plain import decode_positions

MIN_CLASS_NUMEL = 1 << 12  # smaller segments keep one class: a class costs ~40 bytes of header and tables
SMALL_SEGMENT = 1 << 20  # segments up to this size may rank-code every class: their decode time is negligible
MAX_BELOW = 0.15  # larger ones rank-code at most this share of their elements (the rest are the flat top class),
MAX_BELOW_DENSE = 0.5  # or up to 3x their change rate, capped here: dense steps change the bulk octaves too
BITMAP_RATE = 0.25  # a class with at least this share of its members changed sends positions as a bitmap
POSITION_MODES = ("gaps", "bitmap")
VALUE_MODES = ("int", "bits")


@dataclass(frozen=True)
class ClassSpec:
    """One class of one segment as the header describes it (validated)."""

    count: int  # changes in the class
    members: int  # elements of the class (the top class: all elements of the segment, positions are flat)
    pos_mode: str
    gaps: StreamSpec | None  # "gaps" mode only
    val_mode: str
    values: StreamSpec | None  # "int" mode only

    def position_sizes(self) -> list[int]:
        if self.count == 0:
            return []
        if self.pos_mode == "bitmap":
            return [-(-self.members // 8)]
        assert self.gaps is not None
        return self.gaps.part_sizes(self.count)

    def value_sizes(self) -> list[int]:
        if self.count == 0:
            return []
        if self.val_mode == "bits":
            return [-(-self.count // 8)]
        assert self.values is not None
        return self.values.part_sizes(self.count)

    def to_json(self, top: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"n": self.count}
        if not top:
            out["m"] = self.members
        if self.count:
            out["p"], out["v"] = self.pos_mode, self.val_mode
            if self.gaps is not None:
                out["g"] = [self.gaps.k, self.gaps.escapes, self.gaps.escape_width]
            if self.values is not None:
                out["x"] = [self.values.k, self.values.escapes, self.values.escape_width]
        return out


@dataclass(frozen=True)
class SegmentCode:
    """A segment's parsed class layout: element count, dtype, changes, bounds, classes (the top class last)."""

    numel: int
    dtype: torch.dtype
    count: int
    bounds: list[int]
    classes: list[ClassSpec]
    raw_nbytes: int


# --- encode
def encode_segment(
    base: Sequence[np.ndarray] | torch.Tensor,
    pos_K: np.ndarray,
    delta_K: np.ndarray,
    dtype: torch.dtype,
    level: int,
    workers: int = 1,
) -> tuple[dict[str, Any], bytes]:
    """Header fields (count, bounds, classes, raw_nbytes) and zstd frame of one segment's changes.

    base: the segment's base bits, host arrays (unsigned views of its tensors, in order: the segment is their
    concatenation) or one tensor on the weights' device (signed integer view: the class work then runs there with
    torch ops); pos_K: sorted changed positions in the segment; delta_K: wrapped differences (host arrays). Both
    kinds of base give the same bytes.
    """
    count = int(pos_K.size)
    if count == 0:
        return {"count": 0, "bounds": [], "classes": [], "raw_nbytes": 0}, b""
    host = not isinstance(base, torch.Tensor)
    n = sum(p.size for p in base) if host else base.numel()  # type: ignore[union-attr]
    codes_K = zigzag_minus_one(delta_K)
    mask = magnitude_mask(dtype)
    bounds: list[int] = []
    if mask is not None and n >= MIN_CLASS_NUMEL:
        shift = MANTISSA_BITS[dtype]
        if native.enabled() and host:  # the counts read off the base in one pass, no magnitudes gathered
            sample_E, changes_EV = native.bound_histograms(base, mask, shift, sample_stride(n), pos_K, codes_K)  # type: ignore[arg-type]
        else:  # the reference, and a base on a device: the magnitudes gathered (the class pass below needs them)
            sample_mag, mag_K = _magnitudes_for_bounds(base, n, pos_K, mask)
            sample_E, changes_EV = histograms(sample_mag, mag_K, codes_K, mask, shift)
        max_below = 1.0 if n <= SMALL_SEGMENT else min(MAX_BELOW_DENSE, max(MAX_BELOW, 3 * count / n))
        bounds = choose_bounds(sample_E, n, changes_EV, shift, MAX_CLASSES, max_below)
    parts: list[np.ndarray] = []
    specs: list[ClassSpec] = []
    pos_top, codes_top = pos_K, codes_K
    if native.enabled() and host:  # the compiled class pass: one loop over the base
        if bounds:
            assert mask is not None
            members_C, ranks_C, codes_C, pos_top, codes_top = _split_native(base, mask, bounds, pos_K, codes_K, workers)  # type: ignore[arg-type]
            for ranks, n_members, codes in zip(ranks_C, members_C, codes_C, strict=True):
                specs.append(_encode_ranks(ranks, n_members, codes, parts))
        specs.append(_encode_ranks(pos_top, n, codes_top, parts))
    elif bounds:
        assert mask is not None
        flat = (np.concatenate(base) if len(base) > 1 else base[0]) if host else base  # type: ignore[arg-type]
        cls_K = np.searchsorted(np.asarray(bounds, mag_K.dtype), mag_K, side="right")
        for c, flags in enumerate(_class_flags(flat, mask, bounds, pos_K, workers)):  # type: ignore[arg-type]
            codes_C = np.take(codes_K, np.flatnonzero(cls_K == c))
            specs.append(_encode_class(flags, None, codes_C, parts))
        top = np.flatnonzero(cls_K == len(bounds))
        pos_top, codes_top = np.take(pos_K, top), np.take(codes_K, top)
    if len(specs) < len(bounds) + 1:
        specs.append(_encode_class(None, (pos_top, n), codes_top, parts))
    fields = {
        "count": count,
        "bounds": bounds,
        "classes": [s.to_json(i == len(bounds)) for i, s in enumerate(specs)],
        "raw_nbytes": sum(p.nbytes for p in parts),
    }
    return fields, compress_parts(parts, level, literals=True)


def _ranges(n: int, workers: int) -> list[tuple[int, int]]:
    """`workers` position ranges of a segment of n elements, cut at multiples of 64 (the class passes' chunks)."""
    cuts = [min(n, (n * i // workers) & ~63) for i in range(workers)] + [n]
    return list(itertools.pairwise(cuts))


def _split_native(
    parts: Sequence[np.ndarray], mask: int, bounds: list[int], pos_K: np.ndarray, codes_K: np.ndarray, workers: int
) -> tuple[list[int], list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray]:
    """`native.class_split`, and for one large tensor with `workers` > 1, in position ranges side by side: each
    range's ranks start at 0, so the ranges before it add their member counts afterwards."""
    n = parts[0].size
    if workers <= 1 or len(parts) != 1 or n < PARALLEL_MIN:
        return native.class_split(parts, mask, bounds, pos_K, codes_K)
    ranges = _ranges(n, workers)
    cuts = np.searchsorted(pos_K, [lo for lo, _ in ranges] + [n])

    def one(r: int) -> tuple:
        (lo, hi), a, b = ranges[r], cuts[r], cuts[r + 1]
        return native.class_split([parts[0][lo:hi]], mask, bounds, pos_K[a:b] - lo, codes_K[a:b])

    done = parallel_map(one, range(len(ranges)), workers)
    before = np.cumsum([[0] * len(bounds)] + [d[0] for d in done], axis=0)  # [range, class]: members before it
    ranks = [np.concatenate([d[1][c] + before[r][c] for r, d in enumerate(done)]) for c in range(len(bounds))]
    codes = [np.concatenate([d[2][c] for d in done]) for c in range(len(bounds))]
    top_pos = np.concatenate([d[3] + lo for d, (lo, _) in zip(done, ranges, strict=True)])
    return before[-1].tolist(), ranks, codes, top_pos, np.concatenate([d[4] for d in done])


def _positions_native(
    parts: Sequence[np.ndarray],
    mask: int,
    bounds: list[int],
    members_C: list[int],
    ranks_C: list[np.ndarray],
    top: np.ndarray,
    what: str,
    workers: int,
) -> list[np.ndarray]:
    """`native.class_positions`, and for one large tensor with `workers` > 1, in position ranges side by side: the
    class counts before each range first (`native.class_counts` of the ranges before the last, side by side), then
    each range turns the ranks and checks the top positions that fall in it, rebased to it, and must use them all;
    the ranges' members must add up to the header's. Any rank or position out of order or range is left unused by
    the range it falls to, which refuses."""
    n = parts[0].size
    if workers <= 1 or len(parts) != 1 or n < PARALLEL_MIN:
        return native.class_positions(parts, mask, bounds, members_C, ranks_C, top, what)
    ranges = _ranges(n, workers)
    counted = parallel_map(lambda r: native.class_counts([parts[0][r[0] : r[1]]], mask, bounds), ranges[:-1], workers)
    before = np.cumsum([[0] * len(bounds), *counted], axis=0)  # [range, class]: members before it
    last = np.asarray(members_C) - before[-1]
    if (last < 0).any():
        raise PatchError(f"{what}: a class's member count differs from the header's")
    members_R = [*np.diff(before, axis=0).tolist(), last.tolist()]

    def cut(values: np.ndarray, at: Sequence[int]) -> np.ndarray:
        return np.maximum.accumulate(np.searchsorted(values, at))  # monotonic even for unsorted (hostile) input

    rank_cuts = [cut(ranks, [*before[:, c], np.iinfo(np.int64).max]) for c, ranks in enumerate(ranks_C)]
    top_cuts = cut(top, [lo for lo, _ in ranges] + [n])

    def one(r: int) -> list[np.ndarray]:
        lo, hi = ranges[r]
        sub = [
            ranks[rc[r] : rc[r + 1]] - before[r][c]
            for c, (ranks, rc) in enumerate(zip(ranks_C, rank_cuts, strict=True))
        ]
        positions = native.class_positions(
            [parts[0][lo:hi]], mask, bounds, members_R[r], sub, top[top_cuts[r] : top_cuts[r + 1]] - lo, what
        )
        return [p + lo for p in positions]

    # each range used every rank and top position that fell in it, so the segment's are all accounted for
    done = parallel_map(one, range(len(ranges)), workers)
    return [np.concatenate([d[c] for d in done]) for c in range(len(bounds))]


def _magnitudes_for_bounds(
    base: Sequence[np.ndarray] | torch.Tensor, n: int, pos_K: np.ndarray, mask: int
) -> tuple[np.ndarray, np.ndarray]:
    """(|bits| of the strided sample, |bits| of the changed elements) as host unsigned arrays. Host parts give the
    sample of their concatenation: part i, at segment offset o_i, holds the sample's elements from local index
    (-o_i) mod stride on."""
    stride = sample_stride(n)
    if not isinstance(base, torch.Tensor):
        offsets = np.cumsum([0] + [p.size for p in base])
        sample = np.concatenate([p[(-int(o)) % stride :: stride] for p, o in zip(base, offsets[:-1], strict=True)])
        cuts = np.searchsorted(pos_K, offsets)
        changed = [np.take(p, pos_K[cuts[i] : cuts[i + 1]] - offsets[i]) for i, p in enumerate(base)]
        return magnitudes(sample, mask), magnitudes(np.concatenate(changed) if len(changed) > 1 else changed[0], mask)
    unsigned = UINT[base.element_size()]
    sample = (base[::stride] & mask).cpu().numpy().view(unsigned)
    changed = (base[torch.from_numpy(pos_K).to(base.device)] & mask).cpu().numpy().view(unsigned)
    return sample, changed


def _class_flags(
    base: np.ndarray | torch.Tensor, mask: int, bounds: list[int], pos_K: np.ndarray, workers: int
) -> list[np.ndarray]:
    """Changed flags of every class below the top, members in position order."""
    if not isinstance(base, np.ndarray):
        return class_flags_torch(base, mask, bounds, pos_K)
    changed_N = np.zeros(base.size, np.bool_)
    changed_N[pos_K] = True
    flags = [m.changed for m in members(base, mask, bounds, changed_N, workers)]
    assert all(f is not None for f in flags)
    return flags  # type: ignore[return-value]


def _encode_class(
    flags_M: np.ndarray | None, flat: tuple[np.ndarray, int] | None, codes_C: np.ndarray, parts: list[np.ndarray]
) -> ClassSpec:
    """Append one class's parts. A class below the top comes as changed flags per member (`flags_M`), the top
    class as (sorted flat positions, element count) (`flat`); `codes_C` are the changes' value codes."""
    if flags_M is not None:
        members = int(flags_M.size)
        count = int(codes_C.size)
    else:
        assert flat is not None
        members, count = flat[1], int(flat[0].size)
    if count == 0:
        return ClassSpec(0, members, "gaps", None, "int", None)
    gap_spec = value_spec = None
    if count >= BITMAP_RATE * members:
        if flags_M is None:
            assert flat is not None
            flags_M = np.zeros(members, np.bool_)
            flags_M[flat[0]] = True
        parts.append(np.packbits(flags_M, bitorder="little"))
        pos_mode = "bitmap"
    else:
        ranks_C = np.flatnonzero(flags_M) if flags_M is not None else flat[0]  # type: ignore[index]
        gaps_C = np.diff(ranks_C, prepend=-1)
        gaps_C -= 1
        gap_spec, gap_parts = encode_uints(gaps_C.astype(uint_for(members)))
        parts.extend(gap_parts)
        pos_mode = "gaps"
    if int(codes_C.max()) <= 1:
        parts.append(np.packbits(codes_C.astype(np.bool_), bitorder="little"))
        val_mode = "bits"
    else:
        value_spec, value_parts = encode_uints(codes_C)
        parts.extend(value_parts)
        val_mode = "int"
    return ClassSpec(count, members, pos_mode, gap_spec, val_mode, value_spec)


def _encode_ranks(ranks_C: np.ndarray, members: int, codes_C: np.ndarray, parts: list[np.ndarray]) -> ClassSpec:
    """`_encode_class` by the compiled kernels, from the changed members' ranks (flat positions for the top class)
    instead of a flag per member: the same parts."""
    count = int(ranks_C.size)
    if count == 0:
        return ClassSpec(0, members, "gaps", None, "int", None)
    gap_spec = value_spec = None
    if count >= BITMAP_RATE * members:
        parts.append(native.ranks_bitmap(ranks_C, members))
        pos_mode = "bitmap"
    else:
        gap_spec, gap_parts = encode_stream(ranks_C, native.GAPS, None, np.dtype(uint_for(members)).itemsize * 8)
        parts.extend(gap_parts)
        pos_mode = "gaps"
    if int(codes_C.max()) <= 1:
        parts.append(np.packbits(codes_C.astype(np.bool_), bitorder="little"))
        val_mode = "bits"
    else:
        value_spec, value_parts = encode_stream(codes_C, native.VALUES, None, codes_C.itemsize * 8)
        parts.extend(value_parts)
        val_mode = "int"
    return ClassSpec(count, members, pos_mode, gap_spec, val_mode, value_spec)


# --- parse
def _spec(obj: Any, count: int, bits: int) -> StreamSpec:
    if not isinstance(obj, list) or len(obj) != 3:
        raise PatchError(f"stream spec must be [k, escapes, escape_width], got {obj!r}")
    return StreamSpec.from_json(dict(zip(("k", "escapes", "escape_width"), obj, strict=True)), count, bits)


def parse_segment(obj: dict[str, Any], numel: int, dtype: torch.dtype, raw_nbytes: int, what: str) -> SegmentCode:
    """Validate a segment's class fields (types, ranges, sizes); PatchError on anything off."""
    count = get_int(obj, "count", 0, numel)
    bounds, classes_json = obj.get("bounds"), obj.get("classes")
    if not isinstance(bounds, list) or not isinstance(classes_json, list):
        raise PatchError(f"{what}: 'bounds' and 'classes' must be lists")
    if count == 0:
        if bounds or classes_json or raw_nbytes:
            raise PatchError(f"{what}: no changes but classes or payload")
        return SegmentCode(numel, dtype, 0, [], [], 0)
    mask = magnitude_mask(dtype)
    if bounds and (mask is None or numel < MIN_CLASS_NUMEL):
        raise PatchError(f"{what}: magnitude classes are not used for this segment")
    if len(bounds) >= MAX_CLASSES or len(classes_json) != len(bounds) + 1:
        raise PatchError(f"{what}: {len(bounds)} bounds and {len(classes_json)} classes")
    prev = 0
    for b in bounds:
        if type(b) is not int or not prev < b <= (mask or 0):
            raise PatchError(f"{what}: class bounds must increase within (0, {mask}]: {bounds}")
        prev = b
    itemsize = dtype.itemsize
    classes = []
    for c, cobj in enumerate(classes_json):
        if not isinstance(cobj, dict):
            raise PatchError(f"{what}: class {c} is not an object")
        top = c == len(bounds)
        n_members = numel if top else get_int(cobj, "m", 0, numel)
        classes.append(_parse_class(cobj, n_members, itemsize, what))
    if sum(s.count for s in classes) != count:
        raise PatchError(f"{what}: class counts do not add up to {count}")
    if sum(s.members for s in classes[:-1]) > numel:
        raise PatchError(f"{what}: classes hold more members than the segment has elements")
    raw = sum(sum(s.position_sizes()) + sum(s.value_sizes()) for s in classes)
    if raw != raw_nbytes:
        raise PatchError(f"{what}: raw_nbytes {raw_nbytes} but its streams need {raw}")
    return SegmentCode(numel, dtype, count, list(bounds), classes, raw_nbytes)


def _parse_class(obj: dict[str, Any], n_members: int, itemsize: int, what: str) -> ClassSpec:
    count = get_int(obj, "n", 0, n_members)
    if count == 0:
        return ClassSpec(0, n_members, "gaps", None, "int", None)
    pos_mode, val_mode = obj.get("p"), obj.get("v")
    if pos_mode not in POSITION_MODES or val_mode not in VALUE_MODES:
        raise PatchError(f"{what}: unknown class modes {pos_mode!r} / {val_mode!r}")
    gaps = _spec(obj.get("g"), count, 64 if n_members >= 2**32 else 32) if pos_mode == "gaps" else None
    values = _spec(obj.get("x"), count, itemsize * 8) if val_mode == "int" else None
    return ClassSpec(count, n_members, pos_mode, gaps, val_mode, values)


# --- decode
def _unpack_flags(buf_U: np.ndarray, n: int, what: str) -> np.ndarray:
    flags = np.unpackbits(buf_U, bitorder="little")
    if flags[n:].any():
        raise PatchError(f"{what}: non-zero padding after a bit field")
    return flags[:n]


def _ranks(spec: ClassSpec, buf_U: np.ndarray, what: str) -> np.ndarray:
    """Sorted member ranks (flat positions for the top class) of one class's changes, all < spec.members."""
    if spec.pos_mode == "bitmap":
        ranks = np.flatnonzero(_unpack_flags(buf_U, spec.members, what))
        if ranks.size != spec.count:
            raise PatchError(f"{what}: class bitmap has {ranks.size} changes, header says {spec.count}")
        return ranks
    assert spec.gaps is not None
    gaps = decode_uints(buf_U, spec.count, spec.gaps, uint_for(spec.members))
    return decode_positions(gaps, spec.members, what)


def decode_segment(
    code: SegmentCode,
    frame: memoryview,
    parts: Sequence[np.ndarray],
    counts: Sequence[int],
    what: str,
    workers: int = 1,
) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """A segment's changes given its tensors' base bits (`parts`, in order; read only when it has classes, i.e.
    bounds), per tensor: its (sorted segment positions int64, wrapped differences) runs, disjoint (one per
    class that changed there). Each tensor must get the number of changes `counts` gives."""
    if code.count == 0:
        decompress_exact(frame, 0, what)
        return [[] for _ in parts]
    raw_U = decompress_exact(frame, code.raw_nbytes, what)
    mask = magnitude_mask(code.dtype)
    if native.enabled():
        return _decode_native(code, raw_U, parts, counts, mask, what, workers)
    base_U = None
    if code.bounds:
        base_U = np.concatenate(parts) if len(parts) > 1 else parts[0]
    return _by_tensor(_decode_numpy(code, raw_U, base_U, mask, what, workers), parts, counts, what)


def _by_tensor(
    runs: list[tuple[np.ndarray, np.ndarray]], parts: Sequence[np.ndarray], counts: Sequence[int], what: str
) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Segment runs split at the tensors' bounds (positions stay segment positions: staging counts them from
    each tensor's offset); the per-tensor counts checked."""
    offsets = np.cumsum([0] + [p.size for p in parts])
    out: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in parts]
    got = [0] * len(parts)
    for pos, delta in runs:
        cuts = np.searchsorted(pos, offsets).tolist()  # a run's positions are sorted
        for i, (a, b) in enumerate(itertools.pairwise(cuts)):
            if a < b:
                out[i].append((pos[a:b], delta[a:b]))
                got[i] += b - a
    if got != list(counts):
        raise PatchError(f"{what}: changes per tensor {got} differ from the tensor list")
    return out


def _decode_numpy(
    code: SegmentCode, raw_U: np.ndarray, base_U: np.ndarray | None, mask: int | None, what: str, workers: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The numpy reference: one (sorted segment positions, differences) run per class that changed."""
    code_width = code.dtype.itemsize
    value_dtype = UINT[code_width]
    member_lists = []
    if code.bounds and mask is not None:
        assert base_U is not None, "a segment with classes decodes against its base"
        member_lists = members(base_U, mask, code.bounds, None, workers)
    runs = []
    cursor = 0
    for c, spec in enumerate(code.classes):
        top = c == len(code.bounds)
        if not top and member_lists[c].size != spec.members:
            raise PatchError(f"{what}: class {c} has {member_lists[c].size} members, header says {spec.members}")
        if spec.count == 0:
            continue
        size = sum(spec.position_sizes())
        ranks = _ranks(spec, raw_U[cursor : cursor + size], what)
        cursor += size
        size = sum(spec.value_sizes())
        if spec.val_mode == "bits":  # codes 0 / 1: the differences -1 / +1 by table
            delta_C = np.take(DIFFERENCES[code_width], _unpack_flags(raw_U[cursor : cursor + size], spec.count, what))
        else:
            assert spec.values is not None
            delta_C = decode_values(raw_U[cursor : cursor + size], spec.count, spec.values, value_dtype, what)
        cursor += size
        if top:
            if member_lists and (magnitudes(np.take(base_U, ranks), mask) < value_dtype(code.bounds[-1])).any():
                raise PatchError(f"{what}: a top-class position is not in the top class")
            positions = ranks
        else:
            positions = member_lists[c].at(ranks)
        runs.append((positions, delta_C))
    return runs


def _decode_native(
    code: SegmentCode,
    raw_U: np.ndarray,
    parts: Sequence[np.ndarray],
    counts: Sequence[int],
    mask: int | None,
    what: str,
    workers: int,
) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """`decode_segment` by the compiled kernels: each class's ranks and differences, then one pass over the parts
    that turns the ranks of the classes below the top into positions (member counts, ranks and top-class
    membership checked there); one run per class that changed, as the reference gives."""
    code_width = code.dtype.itemsize
    value_dtype = UINT[code_width]
    runs = []
    cursor = 0
    for spec in code.classes:
        if spec.count == 0:
            runs.append((np.zeros(0, np.int64), np.zeros(0, value_dtype)))
            continue
        if spec.pos_mode == "bitmap":
            ranks = native.bitmap_ranks(raw_U, cursor, spec.members, spec.count, what)
        else:
            bits = 64 if spec.members >= 2**32 else 32
            ranks = native.decode_positions(raw_U, cursor, spec.count, spec.gaps, bits, spec.members, what)
        cursor += sum(spec.position_sizes())
        size = sum(spec.value_sizes())
        if spec.val_mode == "bits":  # codes 0 / 1: the differences -1 / +1
            delta_C = unit_steps(_unpack_flags(raw_U[cursor : cursor + size], spec.count, what), value_dtype)
        else:
            delta_C = native.decode_diffs(raw_U, cursor, spec.count, spec.values, value_dtype, what)
        cursor += size
        runs.append((ranks, delta_C))
    if code.bounds:
        assert mask is not None, "classes need a magnitude"
        members_C = [spec.members for spec in code.classes[:-1]]
        ranks_C = [ranks for ranks, _ in runs[:-1]]
        positions_C = _positions_native(parts, mask, code.bounds, members_C, ranks_C, runs[-1][0], what, workers)
        runs = [(pos, delta) for pos, (_, delta) in zip(positions_C, runs[:-1], strict=True)] + runs[-1:]
    return _by_tensor(runs, parts, counts, what)
