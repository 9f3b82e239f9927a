"""Compiled kernels of the PULSE codec (pulse.c), and the switch between them and the numpy reference.

`pip install -e .` builds `_pulse` from pulse.c with the machine's C compiler (setup.py; xxHash is vendored,
BSD-2, and dispatches its hash loop to SSE2 / AVX2 / AVX-512 at run time). Every kernel is one loop of the numpy
reference's algorithm with the GIL released, so threads over tensors run side by side; the numpy code stays the
reference that tests compare bytes and decoded results against (tests/weights/test_native.py).

The kernels are used when the extension imports and `HETERORL_NATIVE` is not "0"; `use(False)` switches them off
within a block (tests, the benchmark's reference column). Why a C extension rather than numba: numba 0.68 adds
llvmlite (208 MB with numba), imports in 2-3 s and compiles each kernel on first use in every process (samplers,
sweep workers, test subprocesses) unless its cache is warm; pulse.c compiles once, at install (~9 s), and
imports in 0.3 ms (docs/weight-sync.md, "Compiled kernels and threads").
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator, Sequence

import numpy as np
import xxhash

from heterorl.weights.format import PatchError

try:  # by name: the compiled module is optional, and a static import of it reads as this package importing itself
    _pulse = importlib.import_module("heterorl.weights.native._pulse")
except ImportError:  # not built (no C compiler at install): the numpy reference runs instead
    _pulse = None

_EMPTY = xxhash.xxh3_128().digest()  # what the reference returns for a digest it was not asked for
BUILT = _pulse is not None
LEVELS = ("baseline", "avx2", "avx512")  # the kernels' loops: x86-64 (SSE2), AVX2 (+ BMI2, POPCNT), AVX-512 BW + VBMI2
LEVEL = LEVELS[_pulse.set_level(len(LEVELS) - 1)] if BUILT else "baseline"  # the highest this CPU runs, used
_enabled = BUILT and os.environ.get("HETERORL_NATIVE", "1") != "0"


def enabled() -> bool:
    """Whether the codec uses the compiled kernels now."""
    return _enabled


@contextlib.contextmanager
def use(flag: bool) -> Iterator[None]:
    """Use the compiled kernels (True, if built) or the numpy reference (False) within the block (not per thread)."""
    global _enabled
    before = _enabled
    _enabled = flag and BUILT
    try:
        yield
    finally:
        _enabled = before


@contextlib.contextmanager
def level(name: str) -> Iterator[None]:
    """Within the block, the kernels run the loops of instruction-set level `name` (one of LEVELS, at most LEVEL:
    tests compare each loop the CPU can run with the reference). Not per thread."""
    if not BUILT:
        yield
        return
    _pulse.set_level(LEVELS.index(name))
    try:
        yield
    finally:
        _pulse.set_level(LEVELS.index(LEVEL))


def _array(buf: object, dtype: np.dtype | type) -> np.ndarray:
    return np.frombuffer(buf, dtype)  # type: ignore[call-overload]


def _checked(what: str, fn, *args):  # type: ignore[no-untyped-def]
    try:
        return fn(*args)
    except _pulse.CodecError as err:
        raise PatchError(f"{what}: {err}") from None


# --- diff scan
def scan(base_U: np.ndarray, new_U: np.ndarray, hash_base: bool, hash_new: bool) -> tuple:
    """diffscan.scan_cpu: (sorted positions int64, wrapped differences, base digest, new digest)."""
    pos, dif, db, dn = _pulse.scan(base_U, new_U, base_U.itemsize, hash_base, hash_new)
    return _array(pos, np.int64), _array(dif, base_U.dtype), db or _EMPTY, dn or _EMPTY


# --- dense tensors (dense.py)
def sampled_changes(base_U: np.ndarray, new_U: np.ndarray, step: int) -> int:
    """np.count_nonzero(base_U[::step] != new_U[::step])."""
    return _pulse.sampled_changes(base_U, new_U, base_U.itemsize, step)


def dense_codes(base_U: np.ndarray, new_U: np.ndarray, hash_base: bool, hash_new: bool) -> tuple:
    """dense.codes_numpy: (zigzag(new - base) of every element, changed elements, base digest, new digest)."""
    out, changed, db, dn = _pulse.dense_codes(base_U, new_U, base_U.itemsize, hash_base, hash_new)
    return _array(out, base_U.dtype), changed, db or _EMPTY, dn or _EMPTY


# --- integer streams
GAPS, VALUES, CODES = 1, 0, 2  # encode_uints kinds: gaps of int64 positions, the values themselves, value codes


def encode_uints(src: np.ndarray, kind: int, k: int, bits: int = 64) -> tuple[np.ndarray, int, int, int, bool]:
    """intcode.encode_uints's parts, concatenated (see pulse.c), the escape count and width, the split point (k = -1:
    chosen for a stream of `bits`-bit integers) and whether that choice was too close to call in C's arithmetic."""
    parts, escapes, width, k, close = _pulse.encode_uints(src, src.itemsize, kind, k, bits)
    return _array(parts, np.uint8), escapes, width, k, bool(close)


def decode_positions(raw: np.ndarray, offset: int, count: int, spec, bits: int, limit: int, what: str) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Sorted positions (int64) from a gap stream at raw[offset:], each in [0, limit)."""
    out = _checked(
        what, _pulse.decode_positions, raw, offset, count, spec.k, spec.escapes, spec.escape_width, bits, limit
    )
    return _array(out, np.int64)


def decode_diffs(raw: np.ndarray, offset: int, count: int, spec, dtype: type, what: str) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Wrapped differences from a value-code stream at raw[offset:]."""
    itemsize = np.dtype(dtype).itemsize
    out = _checked(what, _pulse.decode_diffs, raw, offset, count, spec.k, spec.escapes, spec.escape_width, itemsize)
    return _array(out, dtype)


def dense_decode(raw: np.ndarray, numel: int, spec, itemsize: int, changed: int, what: str) -> tuple:  # type: ignore[no-untyped-def]
    """(positions int64, wrapped differences) from a dense tensor's code stream at raw[0:]; PatchError unless
    exactly `changed` codes are not zero."""
    pos, dif = _checked(
        what, _pulse.dense_decode, raw, 0, numel, spec.k, spec.escapes, spec.escape_width, itemsize, changed
    )
    return _array(pos, np.int64), _array(dif, np.dtype(f"u{itemsize}"))


def empty(count: int, dtype: np.dtype | type) -> np.ndarray:
    """np.empty(count, dtype) from the kernels' block pool (memory that earlier calls already faulted in)."""
    return _array(_pulse.empty(count * np.dtype(dtype).itemsize), dtype)


def set_pool_limit(nbytes: int) -> int:
    """Most bytes of freed blocks the kernels keep for reuse (default 1 GiB); returns the previous limit."""
    return _pulse.set_pool_limit(nbytes) if BUILT else 0


# --- staged decode
def apply_digest(view: np.ndarray, runs: Sequence[tuple[np.ndarray, np.ndarray]], chunk: int, offset: int) -> bytes:
    """staged.apply_changes's chunk pass, in place, positions counted from `offset` (each run's grouped by chunk;
    if they are not, the tensor is left as it was and PatchError raised)."""
    positions, deltas = [r[0] for r in runs], [r[1] for r in runs]
    return _checked("staged changes", _pulse.apply_digest, view, view.itemsize, positions, deltas, chunk, offset)


def revert(view: np.ndarray, pos: np.ndarray, delta: np.ndarray, offset: int) -> None:
    """view[pos - offset] -= delta, wrapping (undoes apply_digest)."""
    _checked("revert", _pulse.revert, view, view.itemsize, pos, delta, offset)


# --- magnitude classes
def class_split(
    parts: Sequence[np.ndarray], mask: int, bounds: list[int], pos_K: np.ndarray, codes_K: np.ndarray
) -> tuple[list[int], list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray]:
    """(member counts, changed ranks, codes) per class below the top, then the top class's positions and codes, of
    the segment that `parts` (its tensors' bits, in order) make up; `pos_K` are positions in that segment."""
    members, ranks, codes, top_pos, top_codes = _pulse.class_split(
        parts, parts[0].itemsize, mask, bounds, pos_K, codes_K
    )
    dtype = codes_K.dtype
    return (
        members,
        [_array(r, np.int64) for r in ranks],
        [_array(c, dtype) for c in codes],
        _array(top_pos, np.int64),
        _array(top_codes, dtype),
    )


def class_positions(
    parts: Sequence[np.ndarray],
    mask: int,
    bounds: list[int],
    members: list[int],
    ranks: list[np.ndarray],
    top: np.ndarray,
    what: str,
) -> list[np.ndarray]:
    """Per class below the top, its changes' sorted positions in the segment that `parts` make up, from their
    member ranks; checks member counts, ranks (sorted, all used) and the top class's positions (`top`)."""
    out = _checked(what, _pulse.class_positions, parts, parts[0].itemsize, mask, bounds, members, ranks, top)
    return [_array(pos, np.int64) for pos in out]


def bound_histograms(
    parts: Sequence[np.ndarray], mask: int, shift: int, stride: int, pos_K: np.ndarray, codes_K: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """classes.histograms of the segment that `parts` make up, read off its base: (per exponent bin, the elements at
    every `stride`-th position; per (exponent bin, value bin), the changes at `pos_K` with codes `codes_K`)."""
    sample, changes = _pulse.bound_histograms(parts, parts[0].itemsize, mask, shift, stride, pos_K, codes_K)
    return _array(sample, np.int64), _array(changes, np.int64).reshape(-1, 64)


def class_counts(parts: Sequence[np.ndarray], mask: int, bounds: list[int]) -> list[int]:
    """Members of each class below the top in the segment that `parts` make up."""
    return _pulse.class_counts(parts, parts[0].itemsize, mask, bounds)


def bitmap_ranks(raw: np.ndarray, offset: int, n: int, count: int, what: str) -> np.ndarray:
    """Set bits (int64) of an n-bit field at raw[offset:]; zero padding and `count` bits set, else PatchError."""
    return _array(_checked(what, _pulse.bitmap_ranks, raw, offset, n, count), np.int64)


def ranks_bitmap(ranks: np.ndarray, n: int) -> np.ndarray:
    """An n-bit field with the bits of `ranks` set (np.packbits order: least significant first)."""
    return _array(_pulse.ranks_bitmap(ranks, n), np.uint8)
