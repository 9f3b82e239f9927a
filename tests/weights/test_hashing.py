"""state_hash: bit-exact identity of names, dtypes, shapes and raw bytes."""

from __future__ import annotations

import torch

from heterorl.weights import state_hash


def base() -> dict[str, torch.Tensor]:
    return {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.zeros(3, dtype=torch.bfloat16)}


def test_equal_weights_equal_hash_regardless_of_insertion_order():
    w = base()
    assert state_hash(w) == state_hash({"b": w["b"].clone(), "a": w["a"].clone()})
    assert len(state_hash(w)) == 32


def test_every_kind_of_difference_changes_the_hash():
    h = state_hash(base())
    variants = [
        {**base(), "a": base()["a"].reshape(3, 2)},  # shape
        {**base(), "b": torch.zeros(3, dtype=torch.float16)},  # dtype, same bytes
        {"c": base()["a"], "b": base()["b"]},  # name
        {**base(), "b": -base()["b"]},  # -0.0 vs +0.0
        {**base(), "extra": torch.zeros(0)},  # an empty tensor still counts
    ]
    nan_a, nan_b = base(), base()
    nan_a["b"].view(torch.int16)[0] = 0x7FC0
    nan_b["b"].view(torch.int16)[0] = 0x7FC1  # another NaN payload
    hashes = {h, *(state_hash(v) for v in variants), state_hash(nan_a), state_hash(nan_b)}
    assert len(hashes) == len(variants) + 3


def test_non_contiguous_and_scalar_tensors_hash_by_value():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert state_hash({"t": t.t()}) == state_hash({"t": t.t().contiguous()})
    assert state_hash({"s": torch.tensor(1.0)}) != state_hash({"s": torch.tensor([1.0])})
