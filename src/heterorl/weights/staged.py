"""Changes staged against the receiver's tensors: the result's digest first, the write only once it checked out.

A decoded patch is, per tensor, positions and wrapped bit differences. Before anything is written the receiver
needs the tensor's digest as it would be (the result check; it also proves the base: an element that differed
from the patch's base would differ in the result). It comes from one pass over the tensor in chunks of
CHUNK_BYTES: the chunk is read into L2, its new values are gathered and added there (base + difference, in
cache: gathering them from the whole tensor afterwards would be a second, random pass over memory), the chunk is
copied to a scratch buffer, patched and hashed. The tensor itself is read once and not written; `commit` then
scatters the kept new values. Bytes touched per element of a bf16 tensor: 2 read by the chunk pass, plus the
scatter's cache lines at commit (~60% of them at 3% changes), against a plain copy's 2 read + 2 written.

A tensor's changes may come as several sorted, disjoint runs (v2's numpy reference decodes one per magnitude
class); they are grouped by chunk with one radix sort of the chunk keys, so every chunk is patched with one
scatter whatever the number of runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import xxhash

from heterorl.weights import native

CHUNK_BYTES = 1 << 18  # per chunk of a tensor: the chunk and its scratch copy (512 KB) stay in L2
BIG = 1 << 22  # elements: a unit this large gets the workers to itself (for its decoder)

Runs = list[tuple[np.ndarray, np.ndarray]]


@dataclass
class TensorChanges:
    """One tensor's staged changes: tensor-local positions grouped by chunk (`cuts[i]:cuts[i + 1]` are chunk
    i's), their differences, and their new values once `digests` has computed them."""

    view: np.ndarray  # the tensor's raw bits (written only by `commit`)
    local: np.ndarray  # int64 positions in the tensor, chunk by chunk (sorted within a chunk for sorted runs)
    delta: np.ndarray  # wrapped differences, same order
    cuts: list[int]  # len(chunks) + 1 offsets into local / delta
    new: np.ndarray  # new bits at `local` (filled by `result_digest`)

    @property
    def chunk(self) -> int:
        return chunk_elements(self.view)

    @property
    def count(self) -> int:
        return int(self.local.size)


def chunk_elements(view: np.ndarray) -> int:
    """Elements per chunk of a tensor (a power of two)."""
    return CHUNK_BYTES // view.itemsize


def _chunks(size: int, chunk: int) -> int:
    return -(-size // chunk)


def stage(view: np.ndarray, runs: Runs) -> TensorChanges:
    """A tensor's changes from `runs`: (sorted tensor-local positions, differences), runs disjoint. Positions
    must already be bounds-checked."""
    runs = [r for r in runs if r[0].size]
    chunk = chunk_elements(view)
    n_chunks = _chunks(view.size, chunk)
    if not runs:
        return _changes(view, np.zeros(0, np.int64), np.zeros(0, view.dtype), [0] * (n_chunks + 1))
    if len(runs) == 1:
        pos, delta = runs[0]
        cuts = np.searchsorted(pos, np.arange(0, view.size + chunk, chunk)[: n_chunks + 1])
        cuts[-1] = pos.size
        return _changes(view, pos, delta, cuts.tolist())
    return _stage_runs(view, runs, chunk, n_chunks)


def _changes(view: np.ndarray, local: np.ndarray, delta: np.ndarray, cuts: list[int]) -> TensorChanges:
    new = native.empty(local.size, view.dtype) if native.enabled() else np.empty(local.size, view.dtype)
    return TensorChanges(view, local, delta, cuts, new)


def _stage_runs(view: np.ndarray, runs: Runs, chunk: int, n_chunks: int) -> TensorChanges:
    """Several runs: key every change by its chunk, stable radix sort by key."""
    pos = np.concatenate([r[0] for r in runs])
    delta = np.concatenate([r[1] for r in runs])
    key = pos // chunk
    key_dtype = np.uint16 if n_chunks <= 1 << 16 else np.int64  # 16-bit keys: numpy's stable sort is a radix sort
    order = np.argsort(key.astype(key_dtype), kind="stable")
    cuts = np.concatenate(([0], np.cumsum(np.bincount(key, minlength=n_chunks)))).tolist()
    return _changes(view, np.take(pos, order), np.take(delta, order), cuts)


def result_digest(tc: TensorChanges) -> bytes:
    """The tensor's digest after the changes, in one chunked pass that also fills `tc.new`. The compiled kernel
    (one loop per tensor) when enabled."""
    view, chunk = tc.view, tc.chunk
    if native.enabled():
        return native.stage_digest(view, tc.local, tc.delta, tc.new, chunk)
    if not tc.count:  # the same bytes
        return xxhash.xxh3_128(view).digest()
    result_h = xxhash.xxh3_128()
    scratch = np.empty(min(chunk, view.size), view.dtype)
    cuts = tc.cuts
    for i, start in enumerate(range(0, view.size, chunk)):
        part = view[start : start + chunk]
        lo, hi = cuts[i], cuts[i + 1]
        if lo == hi:
            result_h.update(part)
            continue
        idx = tc.local[lo:hi] - start
        new = tc.new[lo:hi]
        np.take(part, idx, out=new)
        new += tc.delta[lo:hi]  # exact: unsigned arithmetic wraps mod 2^width
        buf = scratch[: part.size]
        np.copyto(buf, part)
        buf[idx] = new
        result_h.update(buf)
    return result_h.digest()


def commit(tc: TensorChanges) -> None:
    """Write the new values (after `result_digest` computed them and everything was checked)."""
    if tc.count and native.enabled():
        native.scatter(tc.view, tc.local, tc.new)
    elif tc.count:
        tc.view[tc.local] = tc.new


@dataclass(frozen=True)
class Unit:
    """What one decode task covers: tensors [first, first + size) and how to decode their changes (per tensor, its
    runs), given a thread count for the decoder's own parallel work (v2 class enumeration of a big tensor)."""

    first: int
    size: int
    numel: int
    decode: Callable[[int], list[Runs]]


@dataclass(frozen=True)
class Verified:
    """Every tensor's staged changes and its digest after them, in tensor order."""

    changes: list[TensorChanges]
    result_digests: list[bytes]


def prepare(units: Sequence[Unit], views: Sequence[np.ndarray], workers: int) -> Verified:
    """Decode every unit, stage its changes and compute each tensor's digest after them, in `workers` threads.

    One task per unit does decode, staging and the chunk pass of its tensors, so with two threads one tends to
    decode (small numpy operations, mostly holding the GIL) while the other hashes (xxh3 and the chunk copies
    release it). Units of BIG elements or more go first, one at a time, with all the workers for their decoder
    (which may split its own work).
    """
    changes: list[TensorChanges | None] = [None] * len(views)
    result: list[bytes | None] = [None] * len(views)

    def run(unit: Unit, threads: int) -> None:
        per_tensor = unit.decode(threads)
        for j, runs in enumerate(per_tensor):
            tc = stage(views[unit.first + j], runs)
            changes[unit.first + j], result[unit.first + j] = tc, result_digest(tc)

    if workers <= 1:
        for unit in units:
            run(unit, 1)
    else:
        small = [u for u in units if u.numel < BIG]
        for unit in units:
            if unit.numel >= BIG:
                run(unit, workers)
        with ThreadPoolExecutor(workers) as pool:
            _wait([pool.submit(run, u, 1) for u in sorted(small, key=lambda u: -u.numel)])
    assert all(c is not None for c in changes)
    return Verified(changes, result)  # type: ignore[arg-type]


def commit_all(changes: Sequence[TensorChanges], workers: int) -> None:
    """Write every tensor's new values (numpy releases the GIL for the scatters)."""
    if workers <= 1:
        for tc in changes:
            commit(tc)
        return
    with ThreadPoolExecutor(workers) as pool:
        _wait([pool.submit(commit, tc) for tc in sorted(changes, key=lambda tc: -tc.count)])


def _wait(futures: Sequence[Future]) -> None:
    for f in futures:
        f.result()  # re-raises a task's exception (a PatchError from a decoder)
