"""Snapshots: exact round trip for every supported dtype, in-place apply, layout checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from heterorl.weights import PatchError, apply_snapshot, encode_snapshot, load_snapshot, patch_info, state_hash

from ._helpers import DTYPES, bits_equal, normal_weights, random_bits


def weights() -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(0)
    out = {f"{dt}".replace("torch.", ""): random_bits((5, 7), dt, rng) for dt in DTYPES}
    out |= {
        "normal": normal_weights((64, 32), torch.bfloat16, rng),
        "scalar": torch.tensor(-0.0),
        "empty": torch.empty(0, 4, dtype=torch.float16),
        "mask": torch.tensor([True, False, True]),
        "ids": torch.arange(10),
        "f64": torch.randn(3, dtype=torch.float64),
    }
    return out


def test_round_trip_and_info():
    w = weights()
    blob = encode_snapshot(w, version=7)
    info = patch_info(blob)
    assert (info.kind, info.result_version, info.result_hash) == ("snapshot", 7, state_hash(w))
    assert info.numel == sum(t.numel() for t in w.values())
    loaded = load_snapshot(blob)
    assert list(loaded) == sorted(w)
    assert bits_equal(loaded, w)
    assert encode_snapshot(w, version=7, workers=2) == blob


def test_trained_weights_compress():
    rng = np.random.default_rng(1)
    w = {"w": normal_weights((256, 256), torch.bfloat16, rng)}
    assert len(encode_snapshot(w)) < 0.8 * 256 * 256 * 2  # the sign/exponent plane compresses


def test_apply_in_place_and_layout_check():
    w = weights()
    target = {k: torch.zeros_like(v) for k, v in w.items()}
    storage = {k: v.data_ptr() for k, v in target.items()}
    apply_snapshot(target, encode_snapshot(w))
    assert bits_equal(target, w)
    assert {k: v.data_ptr() for k, v in target.items()} == storage  # same tensors, overwritten
    target.pop("ids")
    with pytest.raises(PatchError, match="names differ"):
        apply_snapshot(target, encode_snapshot(w))
