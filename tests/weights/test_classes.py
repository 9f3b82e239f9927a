"""Magnitude classes: the SWAR scan equals the plain comparison, members partition the tensor, bounds pay."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heterorl.weights.classes import (
    choose_bounds,
    class_flags_torch,
    histograms,
    magnitude_mask,
    magnitudes,
    members,
    sample_stride,
    select_below,
)
from heterorl.weights.format import bits_view

from ._helpers import normal_weights


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 3000),
    bound=st.integers(1, 0x7FFF),
    offset=st.integers(0, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_select_below_equals_the_plain_comparison(n, bound, offset, seed):
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 2**16, n + offset, dtype=np.uint16)
    raw[rng.random(raw.size) < 0.3] &= 0x80FF  # many small magnitudes of both signs
    bits = raw[offset:]  # unaligned starts and sizes that are not multiples of 4
    expected = np.flatnonzero((bits & 0x7FFF) < bound)
    assert np.array_equal(select_below(bits, bound, 0x7FFF), expected)


def test_members_partition_the_tensor_by_magnitude():
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        rng = np.random.default_rng(0)
        t = normal_weights((300, 37), dtype, rng)
        bits = bits_view(t)
        mask = magnitude_mask(dtype)
        assert mask is not None
        mag = magnitudes(bits, mask)
        bounds = sorted({int(x) for x in np.quantile(mag, [0.01, 0.05, 0.2, 0.5])})
        groups = members(bits, mask, bounds)
        assert len(groups) == len(bounds)
        edges = [0, *bounds]
        for c, group in enumerate(groups):
            expected = np.flatnonzero((mag >= edges[c]) & (mag < edges[c + 1]))
            assert group.size == expected.size
            assert np.array_equal(group.at(np.arange(group.size)), expected)
        changed = rng.random(bits.size) < 0.1
        for group in members(bits, mask, bounds, changed):
            assert np.array_equal(group.changed, changed[group.at(np.arange(group.size))])


def test_torch_flags_equal_the_host_enumeration():
    """The device path (torch ops, run here on CPU tensors) finds the same classes and flags."""
    rng = np.random.default_rng(3)
    t = normal_weights((5000,), torch.bfloat16, rng)
    bits = bits_view(t)
    bounds = [(127 - e) << 7 for e in (12, 10, 9, 7)]
    pos = np.sort(rng.choice(bits.size, 400, replace=False))
    changed = np.zeros(bits.size, np.bool_)
    changed[pos] = True
    host = [m.changed for m in members(bits, 0x7FFF, bounds, changed)]
    device = class_flags_torch(t.view(torch.int16), 0x7FFF, bounds, pos)
    assert len(host) == len(device) == len(bounds)
    for h, d in zip(host, device, strict=True):
        assert np.array_equal(h, d)


def test_no_bounds_no_members():
    assert members(np.zeros(8, np.uint16), 0x7FFF, []) == []


def test_bounds_follow_the_exponent_when_small_weights_change_more():
    """An Adam-like step (|step| = lr) changes small weights far more often; the chosen classes must separate
    them, and choosing nothing must be the answer when positions are uniform."""
    gen = torch.Generator().manual_seed(0)
    master = torch.randn(400_000, generator=gen) * 0.02
    base, new = master.bfloat16(), (master - 1e-5 * torch.randn(400_000, generator=gen).sign()).bfloat16()
    b, n = bits_view(base), bits_view(new)
    pos = np.flatnonzero(b != n)
    codes = np.ones(pos.size, np.uint16)
    stride = sample_stride(b.size)
    sample = magnitudes(b[::stride].copy(), 0x7FFF)

    def choose(positions: np.ndarray) -> list[int]:
        counts = histograms(sample, magnitudes(b[positions], 0x7FFF), codes[: positions.size], 0x7FFF, 7)
        return choose_bounds(*counts[:1], b.size, counts[1], 7)

    bounds = choose(pos)
    assert len(bounds) >= 3
    assert bounds == sorted(set(bounds))
    assert all(bound % 128 == 0 for bound in bounds)  # exponent boundaries of bf16
    rng = np.random.default_rng(1)
    uniform = np.sort(rng.choice(b.size, pos.size, replace=False))
    assert choose(uniform) == []
    assert choose(pos[:0]) == []
