"""Finding a step's changes: which raw bits differ between base and new, with the tensors' hashes on the way.

CPU tensors are scanned chunk by chunk, so each chunk is hashed (xxh3) and compared while it is in cache.
Tensors on an accelerator are compared there (torch ops on the weights' device: the diff, the positions and the
differences are computed where the weights live, only the changes cross to the host), and hashed from a
host copy, since the state hash is defined over raw bytes (xxh3 has no device implementation here).
"""

from __future__ import annotations

import numpy as np
import torch
import xxhash

from heterorl.weights import native
from heterorl.weights.format import UINT, bits_view, read_bits_view

CHUNK_BYTES = 1 << 18  # bytes of each tensor per pass step: base and new chunks (512 KB) stay in L2
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_EMPTY = xxhash.xxh3_128().digest()


def scan_cpu(
    base_U: np.ndarray, new_U: np.ndarray, hash_base: bool, hash_new: bool
) -> tuple[np.ndarray, np.ndarray, bytes, bytes]:
    """(sorted changed positions int64, wrapped differences new - base, base digest, new digest).

    A digest that was not asked for is the digest of nothing (callers ignore it). The compiled kernel
    (native.scan: one loop, words compared eight bytes at a time, hashed chunk by chunk) when enabled, else
    `scan_numpy`.
    """
    if native.enabled():
        return native.scan(base_U, new_U, hash_base, hash_new)
    return scan_numpy(base_U, new_U, hash_base, hash_new)


def scan_numpy(
    base_U: np.ndarray, new_U: np.ndarray, hash_base: bool, hash_new: bool
) -> tuple[np.ndarray, np.ndarray, bytes, bytes]:
    """The numpy reference of `scan_cpu`.

    One pass over memory: chunk by chunk, xxh3 reads base and new from memory into L2 and the comparison works
    on that cached chunk. Elements are compared eight bytes at a time (four bf16 per 64-bit word):
    `np.flatnonzero` costs ~0.6 ns per flag whatever the density, so one flag per word instead of one per element
    is what makes the scan fast (at 3% changes 11.5% of bf16 words differ). The differing words of both sides
    are gathered while their chunk is cached; splitting them into elements then happens once per tensor, on
    ~4 x 11.5% of its elements, so a chunk costs five array operations plus the two hash updates.
    """
    base_h, new_h = xxhash.xxh3_128(), xxhash.xxh3_128()
    lanes = 8 // base_U.itemsize
    head = base_U.size - base_U.size % lanes
    words_b, words_n = base_U[:head].view(np.uint64), new_U[:head].view(np.uint64)
    step = CHUNK_BYTES // 8  # words per chunk
    differ = np.empty(min(step, words_b.size), np.bool_)  # reused: a fresh temporary per chunk costs more
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (word indices, base words, new words)
    for start in range(0, words_b.size, step):
        b, n = words_b[start : start + step], words_n[start : start + step]
        if hash_base:
            base_h.update(b)
        if hash_new:
            new_h.update(n)
        flags = differ[: b.size]
        np.not_equal(b, n, out=flags)
        cand = np.flatnonzero(flags)
        if cand.size:
            found.append((cand + start, np.take(b, cand), np.take(n, cand)))
    pos_K, delta_K = _split_words(found, lanes, base_U.dtype)
    if head < base_U.size:  # the last < `lanes` elements of a tensor whose size is not a multiple of a word
        b, n = base_U[head:], new_U[head:]
        if hash_base:
            base_h.update(b)
        if hash_new:
            new_h.update(n)
        pos = np.flatnonzero(b != n)
        pos_K = np.concatenate((pos_K, pos + head))
        delta_K = np.concatenate((delta_K, np.take(n, pos) - np.take(b, pos)))
    return pos_K, delta_K, base_h.digest(), new_h.digest()


def _split_words(
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]], lanes: int, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """Element positions and differences from differing words (index, base word, new word)."""
    if not found:
        return np.zeros(0, np.int64), np.zeros(0, dtype)
    if len(found) == 1:
        cand, b_W, n_W = found[0]
    else:
        cand, b_W, n_W = (np.concatenate(parts) for parts in zip(*found, strict=True))
    if lanes == 1:
        delta = n_W.view(dtype) - b_W.view(dtype)
        return cand, delta
    b_L, n_L = b_W.view(dtype), n_W.view(dtype)
    lane = np.flatnonzero(b_L != n_L)
    delta = np.take(n_L, lane)
    delta -= np.take(b_L, lane)  # exact: unsigned arithmetic wraps mod 2^width
    shift = lanes.bit_length() - 1  # lanes is 2, 4 or 8: shifts, since int64 division costs ~3x more
    pos = np.take(cand, lane >> shift)
    pos <<= shift
    pos |= lane & (lanes - 1)
    return pos, delta


def int_view(t: torch.Tensor) -> torch.Tensor:
    """Flat signed-integer view of a tensor's raw bits on its own device (same width)."""
    flat = t.detach().reshape(-1)
    view = _INT_VIEW[t.element_size()]
    return flat if flat.dtype == view else flat.view(view)


def scan_device(
    base_t: torch.Tensor, new_t: torch.Tensor, hash_base: bool, hash_new: bool
) -> tuple[np.ndarray, np.ndarray, bytes, bytes]:
    """`scan_cpu` for tensors on an accelerator: compare on the device, copy only the changes (and, to hash,
    the raw bytes) to the host."""
    base_I, new_I = int_view(base_t), int_view(new_t)
    pos_T = torch.nonzero(base_I != new_I).reshape(-1)
    delta_T = new_I[pos_T] - base_I[pos_T]  # two's complement: wraps like the unsigned difference
    itemsize = base_t.element_size()
    pos_K = pos_T.cpu().numpy()
    delta_K = delta_T.cpu().numpy().view(UINT[itemsize])
    digests = []
    for t, wanted in ((base_t, hash_base), (new_t, hash_new)):
        digests.append(xxhash.xxh3_128(bits_view(t.detach().cpu())).digest() if wanted else _EMPTY)
    return pos_K, delta_K, digests[0], digests[1]


def scan(
    base_t: torch.Tensor, new_t: torch.Tensor, hash_base: bool, hash_new: bool
) -> tuple[np.ndarray, np.ndarray, bytes, bytes]:
    """`scan_cpu` or `scan_device`, by where the tensors live (both must be on the same device)."""
    if base_t.device != new_t.device:
        raise ValueError(f"base and new are on different devices: {base_t.device} vs {new_t.device}")
    if base_t.device.type == "cpu":
        return scan_cpu(read_bits_view(base_t), read_bits_view(new_t), hash_base, hash_new)
    return scan_device(base_t, new_t, hash_base, hash_new)
