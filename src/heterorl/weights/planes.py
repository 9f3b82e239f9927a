"""PULSE's dense tensor layout: a tensor most of whose elements changed, coded without positions.

Every element gets its code c = zigzag(new_bits - base_bits mod 2^width) (0: unchanged; 1, 2: -1, +1; 3, 4: -2,
+2; ...), and the codes are stored as byte planes, byte j of every code in plane j (least significant first),
planes one after another in one zstd frame coded without match finding (`intcode.compressor(literals=True)`):
plane 0 holds nearly all the information, plane 1 of a bf16 step is almost all zeros.

Why: a step at a large learning rate changes most bf16 elements (63-100% at lr 1e-4 on a ~100M model), and then
the sparse layout pays per change, for positions as much as for values: its gap stream, value stream and their
integer coding cost ~5x the CPU of this layout, for about the same bytes (from 0.99x at 79% changed to 1.05x at
63% and 1.15x at 40%: docs/weight-sync.md, "Dense tensors"). So a tensor goes dense when a strided sample of
DENSE_SAMPLE elements finds at least DENSE_SHARE of them changed (`is_dense`). The sample is the same whether the
encoder holds the two tensors (the learner's diff, `encode`) or their changes (a merge, `encode_changes`), so both
make the same choice and write the same bytes.
"""

from __future__ import annotations

import numpy as np
import torch
import xxhash

from heterorl.weights import native
from heterorl.weights.diffscan import int_view
from heterorl.weights.format import UINT, PatchError, bits_view
from heterorl.weights.intcode import compress_parts, decompress_exact

DENSE_SHARE = 0.6  # sampled changed share from which a tensor is coded as byte planes
DENSE_SAMPLE = 1024  # elements looked at to decide (about; strided)
DENSE_MIN_NUMEL = 1 << 16  # smaller tensors stay sparse: too little to gain
_EMPTY = xxhash.xxh3_128().digest()


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
    return _dense(int(np.count_nonzero(base_U[::step] != new_U[::step])), base_U.size)


def is_dense_changes(pos_K: np.ndarray, numel: int) -> bool:
    """`is_dense` from a tensor's sorted changed positions."""
    if numel < DENSE_MIN_NUMEL:
        return False
    sampled = np.arange(0, numel, _stride(numel), dtype=np.int64)
    at = np.minimum(np.searchsorted(pos_K, sampled), max(pos_K.size - 1, 0))
    return _dense(int(np.count_nonzero(pos_K[at] == sampled)) if pos_K.size else 0, numel)


def zigzag(delta_N: np.ndarray) -> np.ndarray:
    """Wrapped difference d (unsigned) -> zigzag(d): 0 -> 0, -1 -> 1, +1 -> 2, -2 -> 3, ... (unsigned throughout)."""
    bits = delta_N.dtype.itemsize * 8
    sign_N = delta_N >> (bits - 1)
    np.negative(sign_N, out=sign_N)  # 0 or all ones
    code_N = delta_N << 1
    code_N ^= sign_N
    return code_N


def unzigzag(code_N: np.ndarray) -> np.ndarray:
    """Inverse of `zigzag`."""
    sign_N = code_N & 1
    np.negative(sign_N, out=sign_N)
    d_N = code_N >> 1
    d_N ^= sign_N
    return d_N


def to_planes(code_N: np.ndarray) -> np.ndarray:
    """Byte planes of codes (uint8, itemsize x numel, least significant byte first)."""
    little = code_N.astype(code_N.dtype.newbyteorder("<"), copy=False)
    return np.ascontiguousarray(little.view(np.uint8).reshape(code_N.size, code_N.itemsize).T).reshape(-1)


def from_planes(raw_U: np.ndarray, itemsize: int) -> np.ndarray:
    """Codes (native unsigned integers) from byte planes."""
    numel = raw_U.size // itemsize
    little = np.ascontiguousarray(raw_U.reshape(itemsize, numel).T).view(np.dtype(UINT[itemsize]).newbyteorder("<"))
    return little.reshape(-1).astype(UINT[itemsize], copy=False)


def planes_numpy(
    base_U: np.ndarray, new_U: np.ndarray, hash_base: bool, hash_new: bool
) -> tuple[np.ndarray, int, bytes, bytes]:
    """The numpy reference of `native.planes`: (byte planes, changed elements, base digest, new digest)."""
    codes = zigzag(new_U - base_U)
    db = xxhash.xxh3_128(base_U).digest() if hash_base else _EMPTY
    dn = xxhash.xxh3_128(new_U).digest() if hash_new else _EMPTY
    return to_planes(codes), int(np.count_nonzero(codes)), db, dn


def scan(
    base_U: np.ndarray, new_U: np.ndarray, hash_base: bool, hash_new: bool
) -> tuple[np.ndarray, int, bytes, bytes]:
    """A dense tensor's diff in one pass, with the hashes: the compiled kernel when enabled, else the reference."""
    if native.enabled():
        return native.planes(base_U, new_U, hash_base, hash_new)
    return planes_numpy(base_U, new_U, hash_base, hash_new)


_SIGNED = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def is_dense_device(base_t: torch.Tensor, new_t: torch.Tensor) -> bool:
    """`is_dense` for tensors on an accelerator (the sample is compared there)."""
    numel = base_t.numel()
    if numel < DENSE_MIN_NUMEL:
        return False
    step = _stride(numel)
    return _dense(int((int_view(base_t)[::step] != int_view(new_t)[::step]).sum().item()), numel)


def scan_device(
    base_t: torch.Tensor, new_t: torch.Tensor, hash_base: bool, hash_new: bool
) -> tuple[np.ndarray, int, bytes, bytes]:
    """`scan` for tensors on an accelerator: codes and planes computed there (two's complement wraps like the
    unsigned difference), only the planes cross to the host; hashed from host copies, as `diffscan.scan_device`."""
    signed = _SIGNED[base_t.element_size()]
    base_S, new_S = int_view(base_t).view(signed), int_view(new_t).view(signed)
    d = new_S - base_S
    codes = (d << 1) ^ (d >> (8 * base_t.element_size() - 1))
    changed = int(torch.count_nonzero(codes).item())
    planes_T = codes.view(torch.uint8).reshape(codes.numel(), -1).t().contiguous().reshape(-1)
    digests = []
    for t, wanted in ((base_t, hash_base), (new_t, hash_new)):
        digests.append(xxhash.xxh3_128(bits_view(t.detach().cpu())).digest() if wanted else _EMPTY)
    return planes_T.cpu().numpy(), changed, digests[0], digests[1]


def planes_of_changes(pos_K: np.ndarray, delta_K: np.ndarray, numel: int) -> np.ndarray:
    """The byte planes of a tensor given its changes (a merge's sum)."""
    codes = np.zeros(numel, delta_K.dtype)
    codes[pos_K] = zigzag(delta_K)
    return to_planes(codes)


def encode(planes_U: np.ndarray, changed: int, level: int) -> tuple[dict[str, object], bytes]:
    """A dense tensor's (header fields, zstd frame)."""
    fields = {"count": changed, "layout": "planes", "raw_nbytes": int(planes_U.nbytes)}
    return fields, compress_parts([planes_U], level, literals=True)


def estimate_nbytes(planes_U: np.ndarray, itemsize: int) -> int:
    """The coded size of byte planes estimated before coding: each plane at the empirical byte entropy of a strided
    sample (what zstd's Huffman coding of literals comes close to)."""
    numel = planes_U.size // itemsize
    sample = np.arange(0, numel, max(1, numel // (DENSE_SAMPLE * 16)))
    bits = 0.0
    for j in range(itemsize):
        hist = np.bincount(planes_U[j * numel + sample], minlength=256)
        q = hist[hist > 0] / sample.size
        bits += float(-(q * np.log2(q)).sum()) * numel
    return int(bits / 8)


def decode(frame: memoryview, numel: int, itemsize: int, count: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(positions int64 sorted, wrapped differences) of a dense tensor; PatchError unless exactly `count` changed."""
    raw_U = decompress_exact(frame, numel * itemsize, what)
    if native.enabled():
        return native.planes_decode(raw_U, itemsize, count, what)
    codes = from_planes(raw_U, itemsize)
    pos_K = np.flatnonzero(codes)
    if pos_K.size != count:
        raise PatchError(f"{what}: its planes hold {pos_K.size} changed elements, the header says {count}")
    return pos_K.astype(np.int64, copy=False), unzigzag(codes[pos_K])
