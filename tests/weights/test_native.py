"""The compiled codec kernels (weights/native/pulse.c) against the numpy reference: the same patch bytes, the same
decoded results, the same refusals, kernel by kernel and end to end."""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heterorl.bench.steps import step_pair
from heterorl.weights import PatchError, apply_patch, ctxcode, encode_patch, native
from heterorl.weights.classes import histograms, members
from heterorl.weights.diffscan import scan_numpy
from heterorl.weights.format import UINT, bits_view
from heterorl.weights.intcode import (
    StreamSpec,
    choose_k,
    decode_uints,
    decode_values,
    encode_stream,
    encode_uints,
    zigzag_minus_one,
)
from heterorl.weights.patch import encode_patches
from heterorl.weights.plain import decode_positions, gaps
from heterorl.weights.staged import TensorChanges, apply_changes, chunk_elements, revert, stage

from ._helpers import bits_equal, clone
from .test_ctxpatch import large_pairs
from .test_patch import weight_pairs

pytestmark = pytest.mark.skipif(not native.BUILT, reason="the compiled kernels are not built")


def test_the_kernels_are_built_and_used_by_default():
    """`pip install -e .` builds them on this project's machines; without them the codec is several times slower."""
    assert native.BUILT, "heterorl.weights.native._pulse did not build: run `pip install -e .` with a C compiler"
    assert native.enabled()
    with native.use(False):
        assert not native.enabled()
    assert native.enabled()


@st.composite
def bit_arrays(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """(base, new) raw-bit arrays of any width and size, changed at a drawn rate, in runs or scattered."""
    itemsize = draw(st.sampled_from([1, 2, 4, 8]))
    n = draw(st.integers(0, 3000))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = UINT[itemsize]
    base = rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)
    new = base.copy()
    rate = draw(st.sampled_from([0.0, 0.01, 0.2, 1.0]))
    moved = rng.random(n) < rate
    new[moved] = rng.integers(0, np.iinfo(dtype).max, int(moved.sum()), dtype=dtype, endpoint=True)
    return base, new


LEVELS = [pytest.param(name, id=name) for name in native.LEVELS]


def _skip_unless_runs(level: str) -> None:
    if native.LEVELS.index(level) > native.LEVELS.index(native.LEVEL):
        pytest.skip(f"this CPU runs the kernels' loops up to {native.LEVEL}, not {level}")


def _scan_matches(base: np.ndarray, new: np.ndarray, hash_base: bool, hash_new: bool) -> None:
    want = scan_numpy(base, new, hash_base, hash_new)
    got = native.scan(base, new, hash_base, hash_new)
    assert np.array_equal(got[0], want[0])
    assert got[0].dtype == np.int64
    assert np.array_equal(got[1], want[1])
    assert got[1].dtype == base.dtype
    assert got[2:] == want[2:]


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=150, deadline=None)
@given(pair=bit_arrays(), hash_base=st.booleans(), hash_new=st.booleans())
def test_scan_equals_the_reference(level, pair, hash_base, hash_new):
    _skip_unless_runs(level)
    with native.level(level):
        _scan_matches(*pair, hash_base, hash_new)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("rate", [0.0005, 0.04, 0.3, 1.0])
def test_scan_of_a_large_tensor_equals_the_reference(level, rate):
    """Past the kernel's chunk (256 KiB) and its groups of blocks, 16-bit elements at every density: the AVX-512
    loop stores a block's differing lanes whole and keeps room for them, which small arrays never stress."""
    _skip_unless_runs(level)
    rng = np.random.default_rng(int(rate * 1e4))
    base = rng.integers(0, 2**16, 300_007, dtype=np.uint16)
    new = base.copy()
    moved = rng.random(base.size) < rate
    new[moved] += rng.integers(1, 2**16, int(moved.sum()), dtype=np.uint16)
    with native.level(level):
        _scan_matches(base, new, True, True)


@st.composite
def streams(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    """(unsigned stream, split point k): geometric, small, huge or all-equal values, any valid k."""
    itemsize = draw(st.sampled_from([2, 4, 8]))
    dtype = UINT[itemsize]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(0, 2500))
    kind = draw(st.sampled_from(["geometric", "small", "huge", "equal"]))
    top = np.iinfo(dtype).max
    if kind == "geometric":
        x = np.minimum(rng.geometric(draw(st.sampled_from([0.5, 0.01, 1e-4])), n), min(top, 2**62)).astype(dtype)
    elif kind == "small":
        x = rng.integers(0, 4, n).astype(dtype)
    elif kind == "huge":
        x = rng.integers(0, top, n, dtype=dtype, endpoint=True)
    else:
        x = np.full(n, draw(st.integers(0, int(top))), dtype)
    k = draw(st.sampled_from([k for k in range(8 * itemsize) if k % 8 != 7]))
    return x, k


@settings(max_examples=200, deadline=None)
@given(streams())
def test_stream_parts_equal_the_reference(stream):
    x, k = stream
    spec, parts = encode_uints(x, k)
    got_spec, got_parts = encode_stream(x, native.VALUES, k)
    assert got_spec == spec
    assert [bytes(p) for p in got_parts] == [bytes(p) for p in parts]
    spec, parts = encode_uints(x)  # k chosen by the reference, and by the kernel (the reference when too close)
    got_spec, got_parts = encode_stream(x, native.VALUES, None, x.itemsize * 8)
    assert got_spec == spec
    assert [bytes(p) for p in got_parts] == [bytes(p) for p in parts]


@settings(max_examples=100, deadline=None)
@given(bit_arrays(), st.integers(1, 300))
def test_sampled_changes_equal_the_reference(pair, step):
    """dense.is_dense's sample: the elements 0, step, 2 step, ... that differ."""
    base, new = pair
    assert native.sampled_changes(base, new, step) == int(np.count_nonzero(base[::step] != new[::step]))


@settings(max_examples=100, deadline=None)
@given(bit_arrays())
def test_gap_and_code_streams_equal_the_reference(pair):
    """Gaps of sorted positions and value codes of differences, computed inside the kernel."""
    base, new = pair
    pos, delta, _, _ = scan_numpy(base, new, False, False)
    gap_x = gaps(pos, UINT[4])
    code_x = zigzag_minus_one(delta)
    for x, src, kind in ((gap_x, pos, native.GAPS), (code_x, delta, native.CODES)):
        k = choose_k(x)
        spec, parts = encode_uints(x, k)
        got_spec, got_parts = encode_stream(src, kind, None, x.itemsize * 8)
        assert got_spec == spec
        assert b"".join(bytes(p) for p in got_parts) == b"".join(bytes(p) for p in parts)
        for k in (0, 1, 2, 3, 6, 8):  # every packing below a byte, most values escaping at k = 0, and one lo plane
            if k < 8 * x.itemsize:
                spec, parts = encode_uints(x, k)
                got_spec, got_parts = encode_stream(src, kind, k, x.itemsize * 8)
                assert got_spec == spec
                assert b"".join(bytes(p) for p in got_parts) == b"".join(bytes(p) for p in parts)


def _outcome(fn):  # type: ignore[no-untyped-def]
    try:
        return fn()
    except PatchError:
        return "PatchError"


def _assert_same_outcome(want_fn, got_fn) -> None:  # type: ignore[no-untyped-def]
    """The reference and the kernel give the same values, or both refuse."""
    want, got = _outcome(want_fn), _outcome(got_fn)
    assert type(want) is type(got)
    assert np.array_equal(want, got)


def _damaged_stream(x: np.ndarray, k: int, rng: np.random.Generator, flips: int) -> tuple[StreamSpec, np.ndarray]:
    """`encode_uints(x, k)`'s spec and parts as one byte array, with `flips` random bytes changed."""
    spec, parts = encode_uints(x, k)
    raw = np.concatenate([np.asarray(p, np.uint8) for p in parts]) if parts else np.zeros(0, np.uint8)
    if raw.size and flips:
        raw[rng.integers(0, raw.size, flips)] ^= rng.integers(1, 256, flips).astype(np.uint8)
    return spec, raw


@settings(max_examples=200, deadline=None)
@given(streams(), st.integers(0, 2**32 - 1), st.integers(0, 3))
def test_stream_decoding_equals_the_reference_on_any_bytes(stream, seed, flips):
    """Valid streams decode to the same values; corrupted ones are refused by both or decode to the same values."""
    x, k = stream
    spec, raw = _damaged_stream(x, k, np.random.default_rng(seed), flips)
    dtype = x.dtype.type
    bits = x.itemsize * 8
    if x.size:
        _assert_same_outcome(
            lambda: decode_positions(decode_uints(raw, x.size, spec, dtype), 2**40, "t"),
            lambda: native.decode_positions(raw, 0, x.size, spec, bits, 2**40, "t"),
        )
    _assert_same_outcome(
        lambda: decode_values(raw, x.size, spec, dtype, "t"),
        lambda: native.decode_diffs(raw, 0, x.size, spec, dtype, "t"),
    )


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(0, 3000),
    st.integers(0, 6),
    st.sampled_from([0.0, 0.03, 0.5]),
    st.integers(0, 3),
)
def test_16bit_codes_split_below_a_byte_decode_as_the_reference(seed, n, k, escape_rate, flips):
    """decode_diffs' byte-table path (16-bit codes, k < 8: a packed byte's symbols from one table entry, bytes
    with an escape symbol by symbol): the reference's values, or its refusal, on valid and corrupted streams,
    all-ones codes (a zero change) included."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 3 << k, n).astype(np.uint16)
    wide = rng.random(n) < escape_rate
    codes[wide] = rng.choice(np.array([3 << k, 0x1234, 0xFFFE, 0xFFFF], np.uint16), int(wide.sum()))
    spec, raw = _damaged_stream(codes, k, rng, flips)
    _assert_same_outcome(
        lambda: decode_values(raw, n, spec, np.uint16, "t"),
        lambda: native.decode_diffs(raw, 0, n, spec, np.uint16, "t"),
    )


@settings(max_examples=150, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 3000),
    st.integers(3, 6),
    st.sampled_from([0.0, 0.02, 0.5]),
    st.integers(0, 3),
    st.integers(-2, 1),
)
def test_byte_gap_streams_decode_as_the_reference(seed, n, k, escape_rate, flips, slack):
    """decode_positions' byte path (k = 3..6: a symbol per byte, the bound checked at escapes and at the end):
    the reference's positions, or its refusal, with escapes, corrupted bytes and a limit around the last
    position."""
    rng = np.random.default_rng(seed)
    gaps = rng.integers(0, 3 << k, n).astype(np.uint32)
    wide = rng.random(n) < escape_rate
    gaps[wide] = rng.integers(3 << k, 1 << 20, int(wide.sum()))
    spec, raw = _damaged_stream(gaps, k, rng, flips)
    limit = max(0, int(gaps.astype(np.int64).sum()) + n + slack)  # the last position is limit - 1 - slack
    _assert_same_outcome(
        lambda: decode_positions(decode_uints(raw, n, spec, np.uint32), limit, "t"),
        lambda: native.decode_positions(raw, 0, n, spec, 32, limit, "t"),
    )


def test_stream_checks_name_the_problem():
    x = np.array([0, 1, 2, 700], np.uint32)
    spec, parts = encode_uints(x, 0)
    raw = np.concatenate(parts)
    bad = raw.copy()
    bad[0] |= 0x03  # the first symbol becomes an escape the spec does not count
    with pytest.raises(PatchError, match="escape"):
        native.decode_positions(bad, 0, 4, spec, 32, 10_000, "t")
    with pytest.raises(PatchError, match="positions run past"):
        native.decode_positions(raw, 0, 4, spec, 32, 10, "t")
    with pytest.raises(PatchError, match="does not fit"):
        native.decode_positions(raw[:-1], 0, 4, spec, 32, 10_000, "t")
    codes = np.array([0, 0xFFFF], np.uint16)  # the all-ones code means "no change"
    spec, parts = encode_uints(codes, 8)
    with pytest.raises(PatchError, match="zero change"):
        native.decode_diffs(np.concatenate(parts), 0, 2, spec, np.uint16, "t")
    with pytest.raises(PatchError, match="does not fit"):
        native.decode_diffs(np.concatenate(parts), 0, 2, StreamSpec(8, 1, 0), np.uint16, "t")


@settings(max_examples=100, deadline=None)
@given(bit_arrays())
def test_staged_apply_and_revert_equal_the_reference(pair):
    """The in-place chunk pass writes the new bits and returns their digest; revert gives the base back, bit for
    bit, in both paths."""
    base, new = pair
    if base.size == 0:
        return
    pos, delta, _, _ = scan_numpy(base, new, False, False)
    digests = []
    for flag in (False, True):
        with native.use(flag):
            view = base.copy()
            tc = stage(view, [(pos, delta)] if pos.size else [])
            digests.append(apply_changes(tc))
            assert np.array_equal(view, new)
            revert(tc)
            assert np.array_equal(view, base)
    assert digests[0] == digests[1] == scan_numpy(new, new, True, False)[2]


@settings(max_examples=60, deadline=None)
@given(bit_arrays(), st.integers(1, 5), st.integers(0, 10**6), st.integers(0, 2**32 - 1))
def test_staged_runs_from_an_offset_equal_the_reference(pair, n_runs, offset, seed):
    """Changes split into several disjoint sorted runs (as v2 decodes one per class), positions counted from an
    offset (the tensor's place in its segment): both paths write the new bits with the same digest, and revert."""
    base, new = pair
    if base.size == 0:
        return
    pos, delta, _, _ = scan_numpy(base, new, False, False)
    which = np.random.default_rng(seed).integers(0, n_runs, pos.size)
    runs = [(pos[which == r] + offset, delta[which == r]) for r in range(n_runs)]
    digests = []
    for flag in (False, True):
        with native.use(flag):
            view = base.copy()
            tc = stage(view, runs, offset)
            digests.append(apply_changes(tc))
            assert np.array_equal(view, new)
            revert(tc)
            assert np.array_equal(view, base)
    assert digests[0] == digests[1] == scan_numpy(new, new, True, False)[2]


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 9), st.integers(1, 40_000), st.sampled_from([0.001, 0.05, 0.5]))
def test_several_runs_of_a_16_bit_tensor_apply_as_the_reference(level, seed, n_runs, n, rate):
    """bf16-sized tensors over several of the AVX-512 path's scratch steps, changes split into runs as v2's classes
    split them; a position given in two runs gets both differences in both paths (the sum, which revert undoes)."""
    _skip_unless_runs(level)
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 2**16, n, dtype=np.uint16)
    pos = np.flatnonzero(rng.random(n) < rate).astype(np.int64)
    delta = rng.integers(1, 2**16, pos.size, dtype=np.uint16)
    which = rng.integers(0, n_runs, pos.size)
    runs = [(pos[which == r] + 7, delta[which == r]) for r in range(n_runs)]
    if pos.size:  # the first change given again in another run
        runs.append((pos[:1] + 7, np.array([12345], np.uint16)))
    want = base.copy()
    for p, d in runs:
        np.add.at(want, p - 7, d)
    digests = []
    for flag in (False, True):
        with native.use(flag), native.level(level):
            view = base.copy()
            tc = stage(view, runs, 7)
            digests.append(apply_changes(tc))
            assert np.array_equal(view, want)
            revert(tc)
            assert np.array_equal(view, base)
    assert digests[0] == digests[1] == scan_numpy(want, want, True, False)[2]


def test_staged_kernel_refuses_positions_outside_their_chunks_and_writes_nothing():
    view = np.arange(chunk_elements(np.zeros(1, np.uint16)) * 2, dtype=np.uint16)
    before = view.copy()
    local = np.array([view.size - 1, 0], np.int64)  # chunk 1 before chunk 0
    tc = TensorChanges(view, [(local, np.ones(2, np.uint16))])
    with native.use(True), pytest.raises(PatchError, match="grouped by chunk"):
        apply_changes(tc)
    assert np.array_equal(view, before)  # the element it had written was taken back
    in_order = (np.array([0, view.size - 2], np.int64), np.ones(2, np.uint16))  # a second run, written first
    tc = TensorChanges(view, [in_order, (local, np.ones(2, np.uint16))])
    with native.use(True), pytest.raises(PatchError, match="grouped by chunk"):
        apply_changes(tc)
    assert np.array_equal(view, before)


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([2, 4]), st.integers(1, 15), st.sampled_from([0.0, 0.02, 0.5, 1.0]))
def test_class_passes_equal_the_reference(level, seed, itemsize, n_bounds, rate):
    """class_split gives each class's members and changed ranks as `classes.members` does; class_positions turns
    the ranks into positions and checks member counts, ranks and top-class positions. Up to 15 bounds (the AVX-512
    loops count classes 8 to a vector) and segments of a few blocks of 4,096 elements."""
    _skip_unless_runs(level)
    with native.level(level):
        _class_passes_match(seed, itemsize, n_bounds, rate)


MANTISSA_BITS = {2: 7, 4: 23}  # bf16, float32


def _class_passes_match(seed: int, itemsize: int, n_bounds: int, rate: float) -> None:
    rng = np.random.default_rng(seed)
    dtype = UINT[itemsize]
    mask = (1 << (8 * itemsize - 1)) - 1
    n = int(rng.integers(1, 13000))
    base = (rng.normal(0, 0.02, n).astype(np.float32).view(np.uint32) >> (16 if itemsize == 2 else 0)).astype(dtype)
    mags = np.sort(np.unique(base & dtype(mask)))
    drawn = rng.choice(mags[1:], min(n_bounds, mags.size - 1)) if mags.size > 1 else []
    if rng.random() < 0.5:  # at exponent boundaries, as choose_bounds gives them (class_split's small table)
        drawn = [int(b) >> MANTISSA_BITS[itemsize] << MANTISSA_BITS[itemsize] for b in drawn]
    bounds = sorted({int(b) for b in drawn} - {0}) or [1]
    pos = np.flatnonzero(rng.random(n) < rate).astype(np.int64)
    codes = rng.integers(0, 5, pos.size).astype(dtype)
    cuts = np.sort(rng.integers(0, n + 1, int(rng.integers(0, 4))))  # the segment as 1-4 tensors
    offsets = np.concatenate(([0], cuts, [n]))
    parts = [base[lo:hi] for lo, hi in itertools.pairwise(offsets)]
    counts = np.diff(np.searchsorted(pos, offsets)).tolist()
    n_members, ranks, class_codes, top_pos, top_codes = native.class_split(parts, mask, bounds, pos, codes)
    changed = np.zeros(n, np.bool_)
    changed[pos] = True
    want = members(base, mask, bounds, changed)
    assert n_members == [m.size for m in want]
    for m, r in zip(want, ranks, strict=True):
        assert np.array_equal(r, np.flatnonzero(m.changed))
    in_top = (base[pos] & dtype(mask)) >= bounds[-1]
    assert np.array_equal(top_pos, pos[in_top])
    assert np.array_equal(top_codes, codes[in_top])

    def positions(members_C=n_members, ranks_C=ranks, top=top_pos):  # type: ignore[no-untyped-def]
        return native.class_positions(parts, mask, bounds, members_C, ranks_C, top, "t")

    found = positions()
    for got, m, got_codes in zip(found, want, class_codes, strict=True):  # changed members, in rank order
        assert np.array_equal(got, m.at(np.flatnonzero(m.changed)))
        assert np.array_equal(got_codes, codes[np.searchsorted(pos, got)])
    runs = [*zip(found, class_codes, strict=True), (top_pos, top_codes)]
    per_part = ctxcode._by_tensor(runs, parts, counts, "t")  # split at the tensors, counts checked
    for part_runs, lo, hi in zip(per_part, offsets[:-1], offsets[1:], strict=True):
        inside = (pos >= lo) & (pos < hi)
        assert np.array_equal(
            np.sort(np.concatenate([p for p, _ in part_runs] or [np.zeros(0, np.int64)])), pos[inside]
        )
    if pos.size:  # one change moved to another tensor, or one more than its tensor has
        moved = list(counts)
        giver = next(i for i, c in enumerate(counts) if c)
        moved[giver] -= 1
        moved[(giver + 1) % len(moved)] += 1
        with pytest.raises(PatchError, match="changes per tensor"):
            ctxcode._by_tensor(runs, parts, moved if len(moved) > 1 else [counts[0] + 1], "t")
    with pytest.raises(PatchError, match="member count"):
        positions(members_C=[m + 1 for m in n_members])
    bigger = next((c for c, r in enumerate(ranks) if r.size), None)
    if bigger is not None:  # a rank past the class's members, or two ranks out of order
        past = [r.copy() for r in ranks]
        past[bigger][-1] = n_members[bigger]
        with pytest.raises(PatchError, match="ranks are not sorted"):
            positions(ranks_C=past)
        if ranks[bigger].size > 1:
            swapped = [r.copy() for r in ranks]
            swapped[bigger][[0, 1]] = swapped[bigger][[1, 0]]
            with pytest.raises(PatchError, match="ranks are not sorted"):
                positions(ranks_C=swapped)
    below = np.flatnonzero(((base & dtype(mask)) < bounds[-1]) & ~changed)  # unchanged small weights
    if below.size:  # one posing as a top-class change
        with pytest.raises(PatchError, match="not in the top class"):
            positions(top=np.sort(np.concatenate([top_pos, below[:1]])))
    if top_pos.size > 1:  # top-class positions out of order, or past the segment
        with pytest.raises(PatchError, match="not in the top class"):
            positions(top=top_pos[::-1].copy())
        with pytest.raises(PatchError, match="not in the top class"):
            positions(top=np.concatenate([top_pos, [n]]))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([2, 4]), st.integers(1, 300))
def test_bound_histograms_equal_the_reference(seed, itemsize, stride):
    """The counts that choose the class bounds, read off the base in one pass (a segment of 1-4 parts, the sample
    strided across them), equal classes.histograms of the gathered magnitudes; positions out of order or past the
    segment are refused."""
    rng = np.random.default_rng(seed)
    dtype = UINT[itemsize]
    mask, shift = (1 << (8 * itemsize - 1)) - 1, {2: 7, 4: 23}[itemsize]
    n = int(rng.integers(1, 9000))
    base = rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)
    pos = np.flatnonzero(rng.random(n) < rng.random()).astype(np.int64)
    codes = rng.integers(0, 100, pos.size).astype(dtype)
    cuts = np.sort(rng.integers(0, n + 1, int(rng.integers(0, 4))))
    parts = [base[lo:hi] for lo, hi in itertools.pairwise([0, *cuts, n])]
    got = native.bound_histograms(parts, mask, shift, stride, pos, codes)
    want = histograms(base[::stride] & dtype(mask), base[pos] & dtype(mask), codes, mask, shift)
    assert np.array_equal(got[0], want[0])
    assert np.array_equal(got[1], want[1])
    if pos.size > 1:
        with pytest.raises(ValueError, match="sorted and in the segment"):
            native.bound_histograms(parts, mask, shift, stride, pos[::-1].copy(), codes)
    with pytest.raises(ValueError, match="sorted and in the segment"):
        native.bound_histograms(
            parts, mask, shift, stride, np.array([n], np.int64), codes[:1] if pos.size else np.ones(1, dtype)
        )


def _both(base, new):  # type: ignore[no-untyped-def]
    out = []
    for flag in (False, True):
        with native.use(flag):
            out.append(encode_patches(base, new))
    return out


@settings(max_examples=60, deadline=None)
@given(weight_pairs())
def test_patch_bytes_are_identical_on_arbitrary_bits(pair):
    base, new = pair
    ref, got = _both(base, new)
    assert got == ref
    for patch in ref:
        weights = clone(base)
        apply_patch(weights, patch)
        assert bits_equal(weights, new)


@settings(max_examples=30, deadline=None)
@given(large_pairs())
def test_patch_bytes_are_identical_with_classes(pair):
    base, new = pair
    ref, got = _both(base, new)
    assert got == ref
    weights = clone(base)
    apply_patch(weights, ref[1])
    assert bits_equal(weights, new)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("step", ["noise", "synthetic"])
def test_both_loops_decode_an_optimizer_step(level, step):
    """A v2 round trip of a 400K-parameter step with the AVX-512 loops and with the baseline, bytes equal to the
    numpy reference's: bf16 segments of hundreds of thousands of elements (many blocks of the class passes) and
    the class counts of a real step."""
    _skip_unless_runs(level)
    base, new = step_pair(step, 400_000, 1e-5)
    with native.level(level):
        patch = encode_patch(base, new, context=True, workers=1)
        weights = clone(base)
        apply_patch(weights, patch, workers=1)
    with native.use(False):
        assert encode_patch(base, new, context=True) == patch
    assert bits_equal(weights, new)


@settings(max_examples=40, deadline=None)
@given(large_pairs(), st.integers(0, 2**32 - 1), st.booleans())
def test_corrupted_patches_are_refused_alike(pair, seed, context):
    """A payload byte flipped and the checksum re-signed: the reference and the kernels both refuse it and leave
    the weights untouched, or both apply the same bits."""
    from heterorl.weights.format import PREFIX, pack, unpack

    base, new = pair
    patch = encode_patch(base, new, context=context)
    blob = unpack(patch)
    payload = bytearray(blob.payload)
    if not payload:
        return
    rng = np.random.default_rng(seed)
    payload[int(rng.integers(0, len(payload)))] ^= int(rng.integers(1, 256))
    forged = pack(blob.header, [bytes(payload)], blob.version)
    assert len(forged) > PREFIX.size
    outcomes = []
    for flag in (False, True):
        weights = clone(base)
        with native.use(flag):
            try:
                apply_patch(weights, forged)
                outcomes.append(("applied", {k: bits_view(v).copy() for k, v in weights.items()}))
            except PatchError:
                assert bits_equal(weights, base)
                outcomes.append(("refused", None))
    assert outcomes[0][0] == outcomes[1][0]


def test_threads_give_the_same_bytes_and_results():
    gen = torch.Generator().manual_seed(0)
    base = {f"w{i}": (torch.randn(300, 257, generator=gen) * 0.02).bfloat16() for i in range(6)}
    new = {k: (v.float() - 1e-4 * torch.randn(v.shape, generator=gen)).bfloat16() for k, v in base.items()}
    one = encode_patches(base, new, workers=1)
    assert encode_patches(base, new, workers=4) == one
    for patch in one:
        weights = clone(base)
        apply_patch(weights, patch, workers=3)
        assert bits_equal(weights, new)


def test_bit_fields_round_trip_and_check_padding():
    ranks = np.array([0, 3, 8, 64, 99], np.int64)
    field = native.ranks_bitmap(ranks, 100)
    flags = np.zeros(100, np.bool_)
    flags[ranks] = True
    assert np.array_equal(field, np.packbits(flags, bitorder="little"))
    assert np.array_equal(native.bitmap_ranks(field, 0, 100, 5, "t"), ranks)
    with pytest.raises(PatchError, match="fewer changes"):
        native.bitmap_ranks(field, 0, 100, 6, "t")
    bad = field.copy()
    bad[-1] |= 0x80  # bit 103: padding
    with pytest.raises(PatchError, match="padding"):
        native.bitmap_ranks(bad, 0, 100, 5, "t")


@pytest.mark.parametrize(("lr", "rate"), [(1e-6, 0.0), (1e-4, 0.0), (0.0, 0.02), (0.0, 0.9)])
def test_the_size_estimate_tracks_the_coded_patch(lr, rate):
    """`estimate_nbytes` (what the store decides snapshot-or-patch by) lands within 25% of the coded v1 patch, from
    sparse Adam-like steps to dense random ones."""
    from heterorl.weights.patch import encode_versions

    gen = torch.Generator().manual_seed(0)
    base = {f"w{i}": (torch.randn(200, 300, generator=gen) * 0.02).bfloat16() for i in range(4)}
    new = {k: (v.float() - lr * torch.randn(v.shape, generator=gen)).bfloat16() for k, v in base.items()}
    if rate:
        rng = np.random.default_rng(0)
        for t in new.values():
            bits = bits_view(t)
            moved = rng.random(bits.size) < rate
            bits[moved] = rng.integers(0, 2**16, int(moved.sum()), dtype=np.uint16)
    out = encode_versions(base, new, formats=(1,))
    assert out.v1 is not None
    assert 0.75 < out.estimated_nbytes / len(out.v1) < 1.25, (out.estimated_nbytes, len(out.v1))


@pytest.mark.parametrize("level", LEVELS)
def test_class_passes_in_ranges_equal_one_pass_and_refuse_alike(level):
    """A tensor above PARALLEL_MIN is split and merged in position ranges by threads (ctxcode): the same classes
    and changes as one pass, and a member count, rank or top-class position that is off is refused."""
    from heterorl.weights.classes import PARALLEL_MIN

    _skip_unless_runs(level)
    rng = np.random.default_rng(5)
    n = PARALLEL_MIN + 4099
    base = (rng.normal(0, 0.02, n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    pos = np.flatnonzero(rng.random(n) < 0.03).astype(np.int64)
    codes = rng.integers(0, 5, pos.size).astype(np.uint16)
    bounds = [(127 - e) << 7 for e in (14, 12, 10, 9)]
    with native.level(level):
        one = native.class_split([base], 0x7FFF, bounds, pos, codes)
        for workers in (2, 3):
            got = ctxcode._split_native([base], 0x7FFF, bounds, pos, codes, workers)
            assert got[0] == one[0]
            for a, b in zip([*one[1], *one[2], one[3], one[4]], [*got[1], *got[2], got[3], got[4]], strict=True):
                assert np.array_equal(a, b)
        members_C, ranks_C, top = one[0], one[1], one[3]

        def positions(members=members_C, ranks=ranks_C, top=top):  # type: ignore[no-untyped-def]
            return ctxcode._positions_native([base], 0x7FFF, bounds, members, ranks, top, "t", 3)

        want = native.class_positions([base], 0x7FFF, bounds, members_C, ranks_C, top, "t")
        for a, b in zip(positions(), want, strict=True):
            assert np.array_equal(a, b)
        assert np.array_equal(np.sort(np.concatenate([*want, top])), pos)
        with pytest.raises(PatchError, match="member count"):
            positions(members=[m + (c == 1) for c, m in enumerate(members_C)])
        swapped = [r.copy() for r in ranks_C]
        middle = swapped[2].size // 2
        swapped[2][[middle, middle + 1]] = swapped[2][[middle + 1, middle]]  # two ranks out of order
        with pytest.raises(PatchError, match="ranks are not sorted"):
            positions(ranks=swapped)
        small = np.flatnonzero((base & 0x7FFF) < bounds[-1])
        fake = np.sort(np.concatenate([top, small[-1:]]))
        with pytest.raises(PatchError, match="not in the top class"):
            positions(top=fake)


NATIVE_DIR = Path(native.__file__).parent


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_kernels_compile_without_their_x86_loops(tmp_path):
    """On a CPU other than x86-64 (ARM servers, Apple silicon) pulse.c builds its portable loops only: the same
    file with every x86 block switched off must still compile (pip install builds it; a failure stops the set-up)."""
    portable = (NATIVE_DIR / "pulse.c").read_text()
    x86_guards = (
        r"^#if defined\(__x86_64__\) && defined\(__GNUC__\)$",
        r"^#if defined\(__x86_64__\) \|\| defined\(_M_X64\)$",
        r"^#ifdef __SSE2__$",
    )
    for guard in x86_guards:
        portable, n = re.subn(guard, "#if 0", portable, flags=re.M)
        assert n >= 1, f"pulse.c has no {guard!r} any more: update this test"
    path = tmp_path / "pulse_portable.c"
    path.write_text(portable)
    include = sysconfig.get_paths()["include"]
    done = subprocess.run(
        ["cc", "-fsyntax-only", "-O2", f"-I{include}", f"-I{NATIVE_DIR}", str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
