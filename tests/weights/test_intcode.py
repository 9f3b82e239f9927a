"""Integer stream coding: hand-computed bytes, zigzag table, and round trips over many distributions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from heterorl.weights.format import PatchError
from heterorl.weights.intcode import DIFFERENCES, StreamSpec, choose_k, decode_uints, encode_uints, unit_steps
from heterorl.weights.intcode import unzigzag_plus_one as _unzigzag_plus_one
from heterorl.weights.intcode import zigzag_minus_one as _zigzag_minus_one


def roundtrip(x: np.ndarray, k: int | None = None) -> np.ndarray:
    spec, parts = encode_uints(x, k)
    buf = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    assert buf.size == sum(spec.part_sizes(x.size))
    return decode_uints(buf, x.size, spec, x.dtype.type)


def test_hand_computed_bytes_k0():
    # k = 0: 2-bit fields min(x, 3), four per byte, least significant first; escapes hold x - 3.
    spec, parts = encode_uints(np.array([0, 1, 2, 3, 4, 300], np.uint32), k=0)
    assert spec == StreamSpec(k=0, escapes=3, escape_width=2)
    fields, esc_lo, esc_hi = parts
    assert fields.tolist() == [0b11_10_01_00, 0b11_11]  # [0,1,2,3] then [3,3] (+ zero padding)
    assert esc_lo.tolist() == [0, 1, 297 & 0xFF]  # escapes 0, 1, 297 as byte planes
    assert esc_hi.tolist() == [0, 0, 297 >> 8]


def test_hand_computed_bytes_k9():
    # k = 9: one low byte plane, then 3-bit symbols (2-bit high field << 1 | bit 8), two per byte.
    x = np.array([0x000, 0x1FF, 0x2AB, 0x7FF], np.uint32)  # high parts x >> 9: 0, 0, 1, 3 (escape 0)
    spec, parts = encode_uints(x, k=9)
    assert spec == StreamSpec(k=9, escapes=1, escape_width=1)
    lo, symbols, esc = parts
    assert lo.tolist() == [0x00, 0xFF, 0xAB, 0xFF]
    assert symbols.tolist() == [0b001_000, 0b111_010]  # symbols 0b000, 0b001 | 0b010, 0b111
    assert esc.tolist() == [0]


def test_zigzag_table():
    delta = np.array([1, 0xFFFF, 2, 0xFFFE, 0x8000, 0x7FFF], np.uint16)  # +1, -1, +2, -2, -32768, +32767
    codes = _zigzag_minus_one(delta)
    assert codes.tolist() == [1, 0, 3, 2, 0xFFFE, 0xFFFD]
    assert np.array_equal(_unzigzag_plus_one(codes), delta)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([np.uint8, np.uint16, np.uint32, np.uint64]).flatmap(
        lambda dt: hnp.arrays(dt, st.integers(0, 600), elements=st.integers(0, int(np.iinfo(dt).max)))
    )
)
def test_roundtrip_any_values(x):
    assert np.array_equal(roundtrip(x), x)


@settings(max_examples=30, deadline=None)
@given(st.floats(1.0, 5000.0), st.integers(0, 2**32 - 1))
def test_roundtrip_geometric_and_every_k(mean, seed):
    x = np.random.default_rng(seed).geometric(1 / mean, 500).astype(np.uint32) - np.uint32(1)
    assert np.array_equal(roundtrip(x), x)
    for k in range(32):
        if k % 8 != 7:
            assert np.array_equal(roundtrip(x, k), x)


def test_choose_k_tracks_the_scale():
    rng = np.random.default_rng(0)
    assert choose_k(rng.integers(0, 2, 10_000).astype(np.uint16)) == 0  # +-1 ULP codes
    k_100 = choose_k((rng.geometric(0.01, 10_000) - 1).astype(np.uint32))
    k_1000 = choose_k((rng.geometric(0.001, 10_000) - 1).astype(np.uint32))
    assert 4 <= k_100 <= 9  # about log2(mean): ~7 low bits are near-uniform
    assert k_100 < k_1000
    assert 9 <= k_1000 <= 13


def test_decode_rejects_inconsistent_streams():
    spec, parts = encode_uints(np.array([0, 1, 5], np.uint32), k=0)
    buf = np.concatenate(parts)
    with pytest.raises(PatchError, match="escape"):
        decode_uints(buf, 3, StreamSpec(0, 0, 0), np.uint32)  # wrong escape count
    padded = buf.copy()
    padded[0] |= 0b11 << 6  # a 4th symbol in the padding
    with pytest.raises(PatchError, match="padding"):
        decode_uints(padded, 3, spec, np.uint32)
    with pytest.raises(PatchError, match="overflows"):  # uint8 with k = 6 leaves 2 bits for the high part
        decode_uints(np.array([0b11 << 6, 0xFF], np.uint8), 1, StreamSpec(6, 1, 1), np.uint8)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_unit_steps_are_the_table_differences_of_codes_0_and_1(dtype):
    flags = np.array([0, 1, 1, 0, 0, 1], np.uint8)
    got = unit_steps(flags, dtype)
    assert got.dtype == dtype
    assert np.array_equal(got, np.take(DIFFERENCES[np.dtype(dtype).itemsize], flags))
    assert got[0] == np.iinfo(dtype).max  # -1 wrapped
    assert got[1] == 1
