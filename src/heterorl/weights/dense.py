"""PULSE's dense tensor layout: a tensor most of whose elements changed, coded without positions.

Every element gets its code c = zigzag(new_bits - base_bits mod 2^width) (0: unchanged; 1, 2: -1, +1; 3, 4: -2,
+2; ...), and the codes of all elements form one `intcode` stream (split at k bits, packed symbols, escapes), in
one zstd frame coded without match finding (`intcode.compressor(literals=True)`): the unchanged elements are
the stream's zeros, so positions cost nothing of their own.

Why: a step at a large learning rate changes most bf16 elements (87% falling to ~60% over the first steps at lr
1e-4 on a ~100M model), and then the sparse layout pays per change, for the positions as much as for the values:
its gap stream, value stream and their integer coding cost 3-5x the CPU of this layout, for about the same
bytes (0.94-1.01x from 79% down to 40% changed: docs/weight-sync.md, "Dense tensors"). So a tensor goes dense
when a strided sample of about DENSE_SAMPLE elements finds at least DENSE_SHARE of them changed (`is_dense`). The
sample is the same whether the encoder holds the two tensors (the learner's diff, `scan`) or only their changes (a
merge, `is_dense_changes`), so both make the same choice and write the same bytes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import xxhash

from heterorl.weights import native
from heterorl.weights.diffscan import int_view
from heterorl.weights.format import UINT, PatchError, bits_view
from heterorl.weights.intcode import (
    StreamSpec,
    compress_parts,
    decode_uints,
    encode_stream,
    encode_uints,
    unzigzag,
    zigzag,
)

DENSE_SHARE = 0.5  # sampled changed share from which a tensor is coded dense
DENSE_SAMPLE = 256  # elements looked at to decide (about; strided): ~5 us a tensor; 45% is taken for 50% 1 in 20 times
DENSE_MIN_NUMEL = 1 << 16  # smaller tensors stay sparse: too little to gain
_ESTIMATE_SAMPLE = 1 << 14  # codes looked at for the size estimate
_ESTIMATE_BINS = 1 << 12  # codes this large or larger share a bin (they cost ~12+ bits either way)
_EMPTY = xxhash.xxh3_128().digest()
_SIGNED = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# --- the choice
def _stride(numel: int) -> int:
    return max(1, numel // DENSE_SAMPLE)


def _dense(changed: int, numel: int) -> bool:
    sampled = -(-numel // _stride(numel))  # elements 0, stride, 2 stride, ... below numel
    return numel >= DENSE_MIN_NUMEL and changed >= DENSE_SHARE * sampled


def is_dense(base_U: np.ndarray, new_U: np.ndarray) -> bool:
    """Whether a tensor whose raw bits are `base_U` and `new_U` (flat) is coded dense."""
    if base_U.size < DENSE_MIN_NUMEL:
        return False
    step = _stride(base_U.size)
    if native.enabled():
        return _dense(native.sampled_changes(base_U, new_U, step), base_U.size)
    return _dense(int(np.count_nonzero(base_U[::step] != new_U[::step])), base_U.size)


def is_dense_changes(pos_K: np.ndarray, numel: int) -> bool:
    """`is_dense` from a tensor's sorted changed positions."""
    if numel < DENSE_MIN_NUMEL or pos_K.size == 0:
        return False
    sampled = np.arange(0, numel, _stride(numel), dtype=np.int64)
    at = np.minimum(np.searchsorted(pos_K, sampled), pos_K.size - 1)
    return _dense(int(np.count_nonzero(pos_K[at] == sampled)), numel)


def is_dense_device(base_t: torch.Tensor, new_t: torch.Tensor) -> bool:
    """`is_dense` for tensors on an accelerator (the sample is compared there)."""
    numel = base_t.numel()
    if numel < DENSE_MIN_NUMEL:
        return False
    step = _stride(numel)
    return _dense(int((int_view(base_t)[::step] != int_view(new_t)[::step]).sum().item()), numel)


# --- codes
def codes_numpy(
    base_U: np.ndarray, new_U: np.ndarray, hash_base: bool, hash_new: bool
) -> tuple[np.ndarray, int, bytes, bytes]:
    """The numpy reference of `native.dense_codes`: (codes, changed elements, base digest, new digest)."""
    codes = zigzag(new_U - base_U)
    db = xxhash.xxh3_128(base_U).digest() if hash_base else _EMPTY
    dn = xxhash.xxh3_128(new_U).digest() if hash_new else _EMPTY
    return codes, int(np.count_nonzero(codes)), db, dn


def scan(
    base_U: np.ndarray, new_U: np.ndarray, hash_base: bool, hash_new: bool
) -> tuple[np.ndarray, int, bytes, bytes]:
    """A dense tensor's diff in one pass, with the hashes: the compiled kernel when enabled, else the reference."""
    if native.enabled():
        return native.dense_codes(base_U, new_U, hash_base, hash_new)
    return codes_numpy(base_U, new_U, hash_base, hash_new)


def scan_device(
    base_t: torch.Tensor, new_t: torch.Tensor, hash_base: bool, hash_new: bool
) -> tuple[np.ndarray, int, bytes, bytes]:
    """`scan` for tensors on an accelerator: the codes computed there (two's complement wraps like the unsigned
    difference), only they cross to the host; hashed from host copies, as `diffscan.scan_device`."""
    itemsize = base_t.element_size()
    signed = _SIGNED[itemsize]
    d = int_view(new_t).view(signed) - int_view(base_t).view(signed)
    codes = (d << 1) ^ (d >> (8 * itemsize - 1))
    changed = int(torch.count_nonzero(codes).item())
    digests = []
    for t, wanted in ((base_t, hash_base), (new_t, hash_new)):
        digests.append(xxhash.xxh3_128(bits_view(t.detach().cpu())).digest() if wanted else _EMPTY)
    return codes.cpu().numpy().view(UINT[itemsize]), changed, digests[0], digests[1]


def codes_of_changes(pos_K: np.ndarray, delta_K: np.ndarray, numel: int) -> np.ndarray:
    """Every element's code, given a tensor's changes (a merge's sum)."""
    codes = np.zeros(numel, delta_K.dtype)
    codes[pos_K] = zigzag(delta_K)
    return codes


# --- bytes
def encode(codes_N: np.ndarray, changed: int, level: int) -> tuple[dict[str, Any], bytes]:
    """A dense tensor's (header fields, zstd frame)."""
    if native.enabled():
        spec, parts = encode_stream(codes_N, native.VALUES, None, codes_N.itemsize * 8)
    else:
        spec, parts = encode_uints(codes_N)
    fields = {
        "count": changed,
        "layout": "dense",
        "values": spec.to_json(),
        "raw_nbytes": sum(p.nbytes for p in parts),
    }
    return fields, compress_parts(parts, level, literals=True)


def estimate_nbytes(codes_N: np.ndarray) -> int:
    """The coded size estimated before coding: every code at the empirical entropy of a strided sample (large codes
    binned together, plus their own bits), as `patch.estimate_nbytes` prices the sparse layout's values."""
    sample = codes_N[:: max(1, codes_N.size // _ESTIMATE_SAMPLE)].astype(np.uint64)
    if sample.size == 0:
        return 0
    big = sample >= _ESTIMATE_BINS - 1
    hist = np.bincount(np.minimum(sample, _ESTIMATE_BINS - 1).astype(np.intp), minlength=_ESTIMATE_BINS)
    q = hist[hist > 0] / sample.size
    raw_bits = float(np.log2(sample[big].astype(np.float64) + 1.0).sum()) / sample.size
    return int(codes_N.size * (float(-(q * np.log2(q)).sum()) + raw_bits) / 8)


def decode(
    raw_U: np.ndarray, numel: int, spec: StreamSpec, dtype: type, changed: int, what: str
) -> tuple[np.ndarray, np.ndarray]:
    """(positions int64 sorted, wrapped differences) from a dense tensor's decompressed stream; PatchError unless
    exactly `changed` codes are not zero."""
    itemsize = np.dtype(dtype).itemsize
    if native.enabled():
        return native.dense_decode(raw_U, numel, spec, itemsize, changed, what)
    codes = decode_uints(raw_U, numel, spec, dtype)
    pos_K = np.flatnonzero(codes)
    if pos_K.size > changed:
        raise PatchError(f"{what}: the codes hold more changed elements than the header says")
    if pos_K.size < changed:
        raise PatchError(f"{what}: the codes hold fewer changed elements than the header says")
    return pos_K.astype(np.int64, copy=False), unzigzag(codes[pos_K])
