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

A tensor's changes may come as several sorted, disjoint runs (v2 decodes one per magnitude class: positions
in the order of their class's ranks); the chunk pass takes each chunk's changes from every run in turn, so no
run is merged or sorted with another. Positions within a tensor are distinct (v1 codes gaps of at least one; v2's
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
    """One tensor's staged changes: runs of positions (each sorted) and their differences. Positions count from
    `offset`, the position of the tensor's first element in what was decoded (a v2 segment of several tensors),
    so that no run is copied to make it tensor-local."""

    view: np.ndarray  # the tensor's raw bits (written by `apply_changes`, restored by `revert`)
    runs: Runs  # disjoint, none empty
    offset: int = 0

    @property
    def chunk(self) -> int:
        return chunk_elements(self.view)

    @property
    def count(self) -> int:
        return sum(int(r[0].size) for r in self.runs)

    def cuts(self) -> list[list[int]]:
        """Per run, offsets where each chunk's changes start, and the end."""
        edges = np.arange(0, _chunks(self.view.size, self.chunk) + 1) * self.chunk + self.offset
        return [np.searchsorted(pos, edges).tolist() for pos, _ in self.runs]


def chunk_elements(view: np.ndarray) -> int:
    """Elements per chunk of a tensor (a power of two)."""
    return CHUNK_BYTES // view.itemsize


def _chunks(size: int, chunk: int) -> int:
    return -(-size // chunk)


def stage(view: np.ndarray, runs: Runs, offset: int = 0) -> TensorChanges:
    """A tensor's changes from `runs`: (sorted positions counted from `offset`, differences), runs disjoint.
    Positions must already be bounds-checked."""
    return TensorChanges(view, [r for r in runs if r[0].size], offset)


def apply_changes(tc: TensorChanges) -> bytes:
    """Write the changes into the tensor and return its digest after them, in one chunked pass. The compiled
    kernel (one loop per tensor) when enabled; it leaves the tensor as it was if a run's positions are not sorted
    within the tensor."""
    view, chunk = tc.view, tc.chunk
    if native.enabled():
        return native.apply_digest(view, tc.runs, chunk, tc.offset)
    if not tc.count:  # the same bytes
        return xxhash.xxh3_128(view).digest()
    result_h = xxhash.xxh3_128()
    cuts = tc.cuts()
    for i, start in enumerate(range(0, view.size, chunk)):
        part = view[start : start + chunk]
        for (pos, delta), cut in zip(tc.runs, cuts, strict=True):
            lo, hi = cut[i], cut[i + 1]
            if lo < hi:
                part[pos[lo:hi] - (start + tc.offset)] += delta[lo:hi]  # exact: unsigned arithmetic wraps mod 2^width
        result_h.update(part)
    return result_h.digest()


def revert(tc: TensorChanges) -> None:
    """Undo `apply_changes`: the base's bits again, bit for bit."""
    for pos, delta in tc.runs:
        if native.enabled():
            native.revert(tc.view, pos, delta, tc.offset)
        else:
            tc.view[pos - tc.offset] -= delta


class Unit(NamedTuple):  # a tuple: one is made per tensor of every patch applied
    """What one decode task covers: tensors [first, first + size) and how to decode their changes (per tensor, its
    runs, positions counted from the unit's first element), given a thread count for the decoder's own parallel
    work (v2 class enumeration of a big tensor)."""

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
        offset = 0  # of the tensor in the unit: its runs' positions count from the unit's first element
        for j, runs in enumerate(per_tensor):
            tc = stage(views[unit.first + j], runs, offset)
            offset += views[unit.first + j].size
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
