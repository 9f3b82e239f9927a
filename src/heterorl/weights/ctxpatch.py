"""PULSE v2 patches (container format version 2): segments of tensors, each coded by magnitude class.

Header (JSON, as v1 apart from the tensor list): `tensors` lists every tensor's `name`, `dtype`, `shape` and
`count` (changed elements), names sorted and unique; `segments` cover the tensors in that order, each with
`size` (how many consecutive tensors, all of one dtype), `offset` / `nbytes` / `raw_nbytes` (its zstd frame,
contiguous in the payload) and the class fields of `ctxcode.py` (`count`, `bounds`, `classes`). A segment's
positions index the concatenation of its tensors' elements.

Why segments: a class costs ~40 bytes of header and Huffman tables, and per-tensor work costs Python overhead;
models have many small tensors (norms, small projections) whose changes follow the same magnitude law (Adam
moves every weight by ~lr), so the encoder groups consecutive tensors of the same dtype until a group holds
SEGMENT_MIN elements; a tensor that size or larger is a segment of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from heterorl.weights import ctxcode, staged
from heterorl.weights.classes import PARALLEL_MIN
from heterorl.weights.format import PatchError, TensorMeta, dtype_name, entry_layout, get_int, parallel_map

SEGMENT_MIN = 1 << 21  # elements: tensors this large are coded alone, smaller ones grouped up to this size

Layout = tuple[str, torch.dtype, tuple[int, ...]]


@dataclass(frozen=True)
class Segment:
    """A parsed segment: which tensors (indices into the tensor list), its payload slice and class layout."""

    first: int
    size: int
    offset: int
    nbytes: int
    code: ctxcode.SegmentCode


def group(layouts: Sequence[Layout]) -> list[list[int]]:
    """Tensor indices per segment: consecutive tensors of one dtype up to SEGMENT_MIN elements together."""
    groups: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i, (_, dtype, shape) in enumerate(layouts):
        n = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if current and (dtype != layouts[current[0]][1] or held >= SEGMENT_MIN or n >= SEGMENT_MIN):
            groups.append(current)
            current, held = [], 0
        current.append(i)
        held += n
    if current:
        groups.append(current)
    return groups


def encode(
    layouts: Sequence[Layout],
    base_bits: Sequence[np.ndarray | torch.Tensor],
    changes: Sequence[tuple[np.ndarray, np.ndarray]],
    level: int,
    workers: int,
) -> tuple[dict[str, Any], list[bytes]]:
    """Header fields (`tensors`, `segments`) and payload frames of a v2 patch from each tensor's base bits (host
    arrays, or flat integer views on the weights' device) and (sorted positions, wrapped differences)."""

    def one(indices: list[int], threads: int) -> tuple[dict[str, Any], bytes]:
        parts = [base_bits[i] for i in indices]
        on_host = isinstance(parts[0], np.ndarray)
        if len(indices) == 1:
            i = indices[0]
            return ctxcode.encode_segment(parts if on_host else parts[0], *changes[i], layouts[i][1], level, threads)  # type: ignore[arg-type]
        offsets = np.cumsum([0] + [_numel(p) for p in parts])
        base = parts if on_host else torch.cat(parts)  # type: ignore[arg-type]  # host parts are read in place
        pos_K = np.concatenate([changes[i][0] + offsets[j] for j, i in enumerate(indices)])
        delta_K = np.concatenate([changes[i][1] for i in indices])
        return ctxcode.encode_segment(base, pos_K, delta_K, layouts[indices[0]][1], level)  # type: ignore[arg-type]

    groups = group(layouts)
    big = [len(g) == 1 and _numel(base_bits[g[0]]) >= PARALLEL_MIN for g in groups]
    coded = _split_by_size(groups, big, one, workers)
    tensors = [
        {"name": name, "dtype": dtype_name(dtype), "shape": list(shape), "count": int(changes[i][0].size)}
        for i, (name, dtype, shape) in enumerate(layouts)
    ]
    segments, frames, offset = [], [], 0
    for indices, (fields, frame) in zip(groups, coded, strict=True):
        segments.append({"size": len(indices), "offset": offset, "nbytes": len(frame), **fields})
        frames.append(frame)
        offset += len(frame)
    return {"tensors": tensors, "segments": segments}, frames


def _numel(bits: np.ndarray | torch.Tensor) -> int:
    return bits.size if isinstance(bits, np.ndarray) else bits.numel()


def parse(header: dict[str, Any], payload_len: int) -> tuple[list[TensorMeta], list[int], list[Segment]]:
    """Validate the tensor list and the segments; returns tensor layouts, per-tensor counts and segments."""
    entries = header.get("tensors")
    seg_json = header.get("segments")
    if not isinstance(entries, list) or not isinstance(seg_json, list):
        raise PatchError("header fields 'tensors' and 'segments' must be lists")
    metas, counts = [], []
    prev = None
    for entry in entries:
        name, dtype, shape = entry_layout(entry, prev)
        prev = name
        meta = TensorMeta(name, dtype, shape, 0, 0, 0)
        if meta.numel > 2**62:
            raise PatchError(f"tensor {name!r}: shape {shape} is absurdly large")
        metas.append(meta)
        counts.append(get_int(entry, "count", 0, meta.numel))
    segments, first, cursor = [], 0, 0
    for obj in seg_json:
        if not isinstance(obj, dict):
            raise PatchError("each entry of 'segments' must be an object")
        size = get_int(obj, "size", 1, len(metas) - first)
        offset, nbytes = get_int(obj, "offset"), get_int(obj, "nbytes")
        if offset != cursor or offset + nbytes > payload_len:
            raise PatchError(f"segment at tensor {first}: payload slice [{offset}, {offset + nbytes}) is misplaced")
        cursor = offset + nbytes
        members = metas[first : first + size]
        if any(m.dtype != members[0].dtype for m in members):
            raise PatchError(f"segment at tensor {first} mixes dtypes")
        numel = sum(m.numel for m in members)
        what = f"segment of {members[0].name!r}" + (f" (+{size - 1} tensors)" if size > 1 else "")
        raw = get_int(obj, "raw_nbytes")
        code = ctxcode.parse_segment(obj, numel, members[0].dtype, raw, what)
        if code.count != sum(counts[first : first + size]):
            raise PatchError(f"{what}: {code.count} changes but its tensors list {sum(counts[first : first + size])}")
        segments.append(Segment(first, size, offset, nbytes, code))
        first += size
    if first != len(metas) or cursor != payload_len:
        raise PatchError(f"segments cover {first} of {len(metas)} tensors and {cursor} of {payload_len} bytes")
    return metas, counts, segments


def _split_by_size(items: Sequence, big: Sequence[bool], fn: Callable, workers: int) -> list:
    """[fn(item, w)] in order: big items one at a time with w = workers (they thread inside), the rest spread
    over `workers` threads with w = 1."""
    out: list = [None] * len(items)
    small = [i for i, b in enumerate(big) if not b]
    for i, b in enumerate(big):
        if b:
            out[i] = fn(items[i], workers)
    for i, result in zip(small, parallel_map(lambda i: fn(items[i], 1), small, workers), strict=True):
        out[i] = result
    return out


def units(
    segments: Sequence[Segment], counts: Sequence[int], views: Sequence[np.ndarray], payload: memoryview
) -> list[staged.Unit]:
    """One decode unit per segment, decoded against the receiver's bits (`views`, one per tensor)."""

    def unit(seg: Segment) -> staged.Unit:
        def decode(threads: int) -> list[staged.Runs]:
            frame = payload[seg.offset : seg.offset + seg.nbytes]
            first, last = seg.first, seg.first + seg.size
            what = f"segment at tensor {first}"
            return ctxcode.decode_segment(seg.code, frame, views[first:last], counts[first:last], what, threads)

        return staged.Unit(seg.first, seg.size, seg.code.numel, decode)

    return [unit(seg) for seg in segments]
