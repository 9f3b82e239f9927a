"""Changes applied to the receiver's tensors in place, each tensor's digest taken as they go, and taken back
(exactly: wrapped differences subtract out) when anything fails.

A decoded patch is, per tensor, positions and wrapped bit differences. The receiver needs the tensor's digest as
it would be (the result check; it also proves the base: an element that differed from the patch's base would
differ in the result). It comes from one pass over the tensor in chunks of CHUNK_BYTES: the chunk's changed
elements get base + difference in place, and the chunk is hashed while it is in cache. When a result digest does
not match (or a decoder fails, or anything raises), every tensor already done gets `revert`: the same positions
minus the same differences, which gives back the base bit for bit (addition modulo 2^width is undone by
subtraction, whatever the values). The caller sees the weights untouched or patched, never between.

Bytes touched per element of a bf16 tensor at 3% changes: 2 read and ~1.5 written back (the cache lines holding a
change, ~75% of them), against a plain copy's 2 + 2. The way before this (hash a patched scratch copy of each
chunk, then scatter the new values once every digest checked out) read the tensor twice and copied it once in
cache: 28 ms for those two passes against 11 now on the synthetic 70M step, 48 against 33 ms for the whole checked
decode (docs/weight-sync.md, "The checked decode in place, and the streams' byte paths").

A tensor's changes may come as several sorted, disjoint runs (v2's numpy reference decodes one per magnitude
class); they are grouped by chunk with one radix sort of the chunk keys, so every chunk is patched in one pass
whatever the number of runs. Positions within a tensor are distinct (v1 codes gaps of at least one; v2's
classes are disjoint), which the numpy reference's fancy-index add needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import xxhash

from heterorl.weights import native

CHUNK_BYTES = 1 << 18  # per chunk of a tensor, in L2 from its writes to its hash (32 KB - 1 MB: the same speed)
BIG = 1 << 22  # elements: a unit this large gets the workers to itself (for its decoder)

Runs = list[tuple[np.ndarray, np.ndarray]]


@dataclass
class TensorChanges:
    """One tensor's staged changes: tensor-local positions grouped by chunk, in chunk order, and their
    differences."""

    view: np.ndarray  # the tensor's raw bits (written by `apply_changes`, restored by `revert`)
    local: np.ndarray  # int64 positions in the tensor, chunk by chunk (sorted within a chunk for sorted runs)
    delta: np.ndarray  # wrapped differences, same order

    @property
    def chunk(self) -> int:
        return chunk_elements(self.view)

    @property
    def count(self) -> int:
        return int(self.local.size)

    def cuts(self) -> list[int]:
        """Offsets into local / delta where each chunk's changes start, and the end."""
        keys = self.local // self.chunk  # in order: grouped by chunk
        return np.searchsorted(keys, np.arange(_chunks(self.view.size, self.chunk) + 1)).tolist()


def chunk_elements(view: np.ndarray) -> int:
    """Elements per chunk of a tensor (a power of two)."""
    return CHUNK_BYTES // view.itemsize


def _chunks(size: int, chunk: int) -> int:
    return -(-size // chunk)


def stage(view: np.ndarray, runs: Runs) -> TensorChanges:
    """A tensor's changes from `runs`: (sorted tensor-local positions, differences), runs disjoint. Positions
    must already be bounds-checked."""
    runs = [r for r in runs if r[0].size]
    if not runs:
        return TensorChanges(view, np.zeros(0, np.int64), np.zeros(0, view.dtype))
    if len(runs) == 1:
        return TensorChanges(view, *runs[0])
    return _stage_runs(view, runs)


def _stage_runs(view: np.ndarray, runs: Runs) -> TensorChanges:
    """Several runs: key every change by its chunk, stable radix sort by key."""
    pos = np.concatenate([r[0] for r in runs])
    delta = np.concatenate([r[1] for r in runs])
    chunk = chunk_elements(view)
    key = pos // chunk
    key_dtype = np.uint16 if _chunks(view.size, chunk) <= 1 << 16 else np.int64  # 16 bits: a radix sort
    order = np.argsort(key.astype(key_dtype), kind="stable")
    return TensorChanges(view, np.take(pos, order), np.take(delta, order))


def apply_changes(tc: TensorChanges) -> bytes:
    """Write the changes into the tensor and return its digest after them, in one chunked pass. The compiled
    kernel (one loop per tensor) when enabled; it leaves the tensor as it was if the positions are not grouped by
    chunk."""
    view, chunk = tc.view, tc.chunk
    if native.enabled():
        return native.apply_digest(view, tc.local, tc.delta, chunk)
    if not tc.count:  # the same bytes
        return xxhash.xxh3_128(view).digest()
    result_h = xxhash.xxh3_128()
    cuts = tc.cuts()
    for i, start in enumerate(range(0, view.size, chunk)):
        part = view[start : start + chunk]
        lo, hi = cuts[i], cuts[i + 1]
        if lo < hi:
            part[tc.local[lo:hi] - start] += tc.delta[lo:hi]  # exact: unsigned arithmetic wraps mod 2^width
        result_h.update(part)
    return result_h.digest()


def revert(tc: TensorChanges) -> None:
    """Undo `apply_changes`: the base's bits again, bit for bit."""
    if tc.count and native.enabled():
        native.revert(tc.view, tc.local, tc.delta)
    elif tc.count:
        tc.view[tc.local] -= tc.delta


class Unit(NamedTuple):  # a tuple: one is made per tensor of every patch applied
    """What one decode task covers: tensors [first, first + size) and how to decode their changes (per tensor, its
    runs), given a thread count for the decoder's own parallel work (v2 class enumeration of a big tensor)."""

    first: int
    size: int
    numel: int
    decode: Callable[[int], list[Runs]]


@dataclass(frozen=True)
class Applied:
    """Every tensor's changes, written, and its digest after them, in tensor order."""

    changes: list[TensorChanges]
    result_digests: list[bytes]

    def revert(self) -> None:
        """Give every tensor its base back."""
        _revert_all(self.changes)


def _revert_all(changes: Sequence[TensorChanges | None]) -> None:
    for tc in changes:
        if tc is not None:
            revert(tc)


def apply_all(units: Sequence[Unit], views: Sequence[np.ndarray], workers: int) -> Applied:
    """Decode every unit and apply its changes in place with each tensor's digest after them, in `workers`
    threads. If anything raises (a decoder's PatchError, an interrupt), the tensors already written are reverted
    before the exception leaves: the caller's weights are as they were.

    One task per unit does decode, staging and the chunk pass of its tensors, so with two threads one tends to
    decode (small numpy operations, mostly holding the GIL) while the other hashes (xxh3 and the chunk pass
    release it). Units of BIG elements or more go first, one at a time, with all the workers for their decoder
    (which may split its own work).
    """
    changes: list[TensorChanges | None] = [None] * len(views)
    result: list[bytes | None] = [None] * len(views)

    def run(unit: Unit, threads: int) -> None:
        per_tensor = unit.decode(threads)
        for j, runs in enumerate(per_tensor):
            tc = stage(views[unit.first + j], runs)
            digest = apply_changes(tc)  # written only if it returns
            changes[unit.first + j], result[unit.first + j] = tc, digest

    try:
        if workers <= 1:
            for unit in units:
                run(unit, 1)
        else:
            small = [u for u in units if u.numel < BIG]
            for unit in units:
                if unit.numel >= BIG:
                    run(unit, workers)
            with ThreadPoolExecutor(workers) as pool:  # leaving the block waits for every task
                _wait([pool.submit(run, u, 1) for u in sorted(small, key=lambda u: -u.numel)])
    except BaseException:
        _revert_all(changes)
        raise
    assert all(c is not None for c in changes)
    return Applied(changes, result)  # type: ignore[arg-type]


def _wait(futures: Sequence[Future]) -> None:
    for f in futures:
        f.result()  # re-raises a task's exception (a PatchError from a decoder)
