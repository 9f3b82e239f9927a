"""PULSE v1 tensor coding: one gap stream and one value stream per tensor, no context.

Positions are stored as gaps between consecutive sorted flat indices (gap - 1, so 0 means adjacent); values
as the exact integer difference new_bits - base_bits modulo 2^width, zigzagged and minus one (a changed element
never has difference 0). An Adam step moves a changed bf16 weight by one ULP, i.e. +-1 in its bits, so values
cost ~1 bit instead of 16. Both streams go through `intcode` and one zstd frame: [gap parts][value parts],
coded without match finding (`intcode.compressor(literals=True)`): the parts are near-iid symbols, on which
zstd's short matches cost more than they save (measured 2026-11-28 by encoding heterorl.bench.steps' synthetic,
Qwen3 and noise steps both ways: 0.4-0.9% fewer bytes, 4-7% less encode CPU).
This is the layout of format version 1, and of every tensor of a v2 patch that has a single class.

A v1 tensor most of whose elements changed is coded dense instead (`"layout": "dense"`, dense.py): no gap
stream, one value stream of every element's code (0 = unchanged); `encode_tensor` makes that choice by the same
rule as the learner's diff, so a merged patch is coded as if its versions had been one step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from heterorl.weights import dense, native
from heterorl.weights.format import UINT, PatchError, TensorMeta, get_int
from heterorl.weights.intcode import (
    StreamSpec,
    compress_parts,
    decode_uints,
    decode_values,
    decompress_exact,
    encode_stream,
    encode_uints,
    uint_for,
    zigzag_minus_one,
)


@dataclass(frozen=True)
class PlainTensor:
    """A tensor's v1 entry: layout, change count, the two stream specs (no gap stream for a dense tensor: its
    value stream holds a code for every element)."""

    meta: TensorMeta
    count: int
    gaps: StreamSpec | None
    values: StreamSpec

    def decode(self, payload: memoryview, base_U: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(positions int64 sorted, wrapped differences); the base is not needed."""
        return decode_tensor(self, payload)


def encode_tensor(
    pos_K: np.ndarray,
    delta_K: np.ndarray,
    numel: int,
    level: int,
    ks: tuple[int, int] | None = None,
    is_dense: bool | None = None,
) -> tuple[dict[str, Any], bytes]:
    """Gap + value streams of one tensor -> (header fields, zstd frame), or its code stream when it is dense
    (`is_dense` when the caller's diff decided it, else `dense.is_dense_changes`). `ks`: the streams' split
    points, if the caller chose them already; else they are chosen as `choose_k` chooses them."""
    if is_dense is None:
        is_dense = ks is None and dense.is_dense_changes(pos_K, numel)
    if is_dense:
        return dense.encode(dense.codes_of_changes(pos_K, delta_K, numel), int(pos_K.size), level)
    if native.enabled():  # k chosen in C unless given (the same choice)
        k_gaps, k_values = (None, None) if ks is None else ks
        gap_spec, gap_parts = encode_stream(pos_K, native.GAPS, k_gaps, np.dtype(uint_for(numel)).itemsize * 8)
        value_spec, value_parts = encode_stream(delta_K, native.CODES, k_values, delta_K.itemsize * 8)
    else:
        k_gaps, k_values = (None, None) if ks is None else ks
        gap_spec, gap_parts = encode_uints(gaps(pos_K, uint_for(numel)), k_gaps)
        value_spec, value_parts = encode_uints(zigzag_minus_one(delta_K), k_values)
    parts = gap_parts + value_parts
    fields = {
        "count": int(pos_K.size),
        "gaps": gap_spec.to_json(),
        "values": value_spec.to_json(),
        "raw_nbytes": sum(p.nbytes for p in parts),
    }
    return fields, compress_parts(parts, level, literals=True)


def gaps(pos_K: np.ndarray, dtype: type[np.unsignedinteger]) -> np.ndarray:
    """g_i = p_i - p_(i-1) - 1 (p_(-1) = -1) of sorted distinct positions, in `dtype` (which must hold them)."""
    gaps_K = np.empty(pos_K.size, dtype)
    if pos_K.size:
        gaps_K[0] = pos_K[0]
        np.subtract(pos_K[1:], pos_K[:-1], out=gaps_K[1:], casting="unsafe")
        gaps_K[1:] -= dtype(1)
    return gaps_K


def parse_tensor(meta: TensorMeta, entry: dict[str, Any]) -> PlainTensor:
    """Validate a tensor's v1 fields: count, stream specs (or the dense layout), raw size."""
    count = get_int(entry, "count", 0, meta.numel)
    layout = entry.get("layout", "sparse")
    if layout == "dense":
        values = StreamSpec.from_json(entry.get("values"), meta.numel, meta.itemsize * 8)
        raw = sum(values.part_sizes(meta.numel))
        if raw != meta.raw_nbytes:
            raise PatchError(f"tensor {meta.name!r}: raw_nbytes {meta.raw_nbytes} but its code stream needs {raw}")
        return PlainTensor(meta, count, None, values)
    if layout != "sparse":
        raise PatchError(f"tensor {meta.name!r}: unknown layout {str(layout)[:32]!r}")
    gaps = StreamSpec.from_json(entry.get("gaps"), count, 64 if meta.numel >= 2**32 else 32)
    values = StreamSpec.from_json(entry.get("values"), count, meta.itemsize * 8)
    raw = sum(gaps.part_sizes(count)) + sum(values.part_sizes(count))
    if raw != meta.raw_nbytes:
        raise PatchError(f"tensor {meta.name!r}: raw_nbytes {meta.raw_nbytes} but its streams need {raw}")
    return PlainTensor(meta, count, gaps, values)


def decode_positions(gaps_K: np.ndarray, limit: int, what: str) -> np.ndarray:
    """Sorted positions (int64) from gap - 1 values, each checked to lie in [0, limit)."""
    count = gaps_K.size
    # every gap < limit and the float sum <= limit rule out int64 overflow; then check exactly
    if int(gaps_K.max()) >= limit or float(gaps_K.sum(dtype=np.float64)) + count > limit * (1 + 1e-9):
        raise PatchError(f"{what}: positions run past its {limit} elements")
    pos_K = torch.cumsum(torch.from_numpy(gaps_K.astype(np.int64)), 0).numpy()  # ~2x faster than numpy's cumsum
    pos_K += np.arange(count, dtype=np.int64)  # sum of (gap + 1) - 1: strictly increasing
    if pos_K[-1] >= limit:
        raise PatchError(f"{what}: position {int(pos_K[-1])} out of range [0, {limit})")
    return pos_K


def decode_tensor(tp: PlainTensor, payload: memoryview) -> tuple[np.ndarray, np.ndarray]:
    """(positions int64, wrapped bit differences uint) of one tensor, with every bound checked."""
    meta, count = tp.meta, tp.count
    value_dtype = UINT[meta.itemsize]
    frame = payload[meta.offset : meta.offset + meta.nbytes]
    if tp.gaps is None:  # dense: a code for every element
        raw_U = decompress_exact(frame, meta.raw_nbytes, f"tensor {meta.name!r}")
        return dense.decode(raw_U, meta.numel, tp.values, value_dtype, count, f"tensor {meta.name!r}")
    if count == 0:
        decompress_exact(frame, 0, f"tensor {meta.name!r}")
        return np.zeros(0, np.int64), np.zeros(0, value_dtype)
    raw_U = decompress_exact(frame, meta.raw_nbytes, f"tensor {meta.name!r}")
    gap_nbytes = sum(tp.gaps.part_sizes(count))
    if native.enabled():
        what = f"tensor {meta.name!r}"
        bits = 64 if meta.numel >= 2**32 else 32
        pos_K = native.decode_positions(raw_U, 0, count, tp.gaps, bits, meta.numel, what)
        return pos_K, native.decode_diffs(raw_U, gap_nbytes, count, tp.values, value_dtype, what)
    gaps_K = decode_uints(raw_U[:gap_nbytes], count, tp.gaps, uint_for(meta.numel))
    pos_K = decode_positions(gaps_K, meta.numel, f"tensor {meta.name!r}")
    return pos_K, decode_values(raw_U[gap_nbytes:], count, tp.values, value_dtype, f"tensor {meta.name!r}")
