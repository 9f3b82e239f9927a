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

from heterorl.weights.format import UINT, bits_view

CHUNK = 1 << 18  # elements per pass step: keeps base, new and scratch chunks in L2 while diffing and hashing
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def scan_cpu(
    base_U: np.ndarray, new_U: np.ndarray, hash_base: bool, hash_new: bool
) -> tuple[np.ndarray, np.ndarray, bytes, bytes]:
    """(sorted changed positions int64, wrapped differences new - base, base digest, new digest).

    A digest that was not asked for is the digest of nothing (callers ignore it).
    """
    base_h, new_h = xxhash.xxh3_128(), xxhash.xxh3_128()
    found = []
    differ = np.empty(min(CHUNK, base_U.size), np.bool_)  # reused: a fresh temporary per chunk costs ~50% more
    for start in range(0, base_U.size, CHUNK):
        b, n = base_U[start : start + CHUNK], new_U[start : start + CHUNK]
        if hash_base:
            base_h.update(b)
        if hash_new:
            new_h.update(n)
        out = differ[: b.size]
        np.not_equal(b, n, out=out)
        idx = np.flatnonzero(out)
        if idx.size:
            idx += start
            found.append(idx)
    pos_K = np.concatenate(found) if found else np.zeros(0, np.int64)
    delta_K = np.take(new_U, pos_K)
    delta_K -= np.take(base_U, pos_K)  # exact: unsigned arithmetic wraps mod 2^width
    return pos_K, delta_K, base_h.digest(), new_h.digest()


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
        digests.append(xxhash.xxh3_128(bits_view(t.detach().cpu())).digest() if wanted else xxhash.xxh3_128().digest())
    return pos_K, delta_K, digests[0], digests[1]


def scan(
    base_t: torch.Tensor, new_t: torch.Tensor, hash_base: bool, hash_new: bool
) -> tuple[np.ndarray, np.ndarray, bytes, bytes]:
    """`scan_cpu` or `scan_device`, by where the tensors live (both must be on the same device)."""
    if base_t.device != new_t.device:
        raise ValueError(f"base and new are on different devices: {base_t.device} vs {new_t.device}")
    if base_t.device.type == "cpu":
        return scan_cpu(bits_view(base_t.detach()), bits_view(new_t.detach()), hash_base, hash_new)
    return scan_device(base_t, new_t, hash_base, hash_new)
