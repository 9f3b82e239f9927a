"""Entropy bounds: hand-computed values, and contexts that carry information lower them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from heterorl.weights.entropy import bounds, h_bits, kt_bits, step_entropy, symbol_entropy_bits


def test_binary_entropy_by_hand():
    assert h_bits(np.array([1]), np.array([2])) == pytest.approx(2.0)  # 2 elements, p = 1/2: 1 bit each
    assert h_bits(np.array([0, 4]), np.array([4, 4])) == 0.0  # certain cells cost nothing
    assert h_bits(np.array([1]), np.array([4])) == pytest.approx(
        4 * (-(0.25 * math.log2(0.25) + 0.75 * math.log2(0.75)))
    )


def test_kt_pays_a_learning_cost_over_the_empirical_entropy():
    n, k = np.array([1000]), np.array([100])
    extra = kt_bits(k, n) - h_bits(k, n)
    assert 0.5 * math.log2(1000) < extra < 0.5 * math.log2(1000) + 2
    assert kt_bits(np.array([0]), np.array([1])) == pytest.approx(1.0)  # one flag, KT gives it probability 1/2


def test_symbol_entropy_with_and_without_cells():
    symbols = np.array([0, 0, 1, 1])
    assert symbol_entropy_bits(symbols) == pytest.approx(4.0)
    assert symbol_entropy_bits(symbols, cells=np.array([7, 7, 9, 9])) == 0.0  # each cell is constant


def test_exponent_context_explains_changes_of_small_weights():
    """Only the weights below 2^-10 change: given the exponent the positions are certain."""
    rng = np.random.default_rng(0)
    base = torch.from_numpy(rng.normal(0, 0.02, 20_000).astype(np.float32)).bfloat16()
    small = base.abs() < 2**-10
    new = torch.where(small, (base.view(torch.int16) + 1).view(torch.bfloat16), base)
    result = step_entropy({"w": base}, {"w": new})
    assert result["_totals"]["changed"] == int(small.sum())
    assert result["tensor"]["pos_h"] > 0.2 * small.sum().item()
    assert result["exponent"]["pos_h"] == pytest.approx(0.0, abs=1e-9)
    assert result["exponent"]["val_h"] == 0.0  # all +1
    b = bounds({"w": base}, {"w": new})
    assert b["exponent_bits"] < b["independent_bits"]
    assert bounds({"w": base}, {"w": base}) == {"independent_bits": 0.0, "exponent_bits": 0.0, "changed": 0.0}
