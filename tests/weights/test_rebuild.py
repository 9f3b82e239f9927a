"""WeightStore.weights_at: every retained version rebuilt from the newest by reverting patch records, bit for bit
and hash-checked (what the rollout verifier re-scores claimed versions with); what cannot be rebuilt says so."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from heterorl.weights import PatchError, WeightStore, make_codec, merge_patches
from heterorl.weights.patch import encode_patch, revert_patch

from ._helpers import bits_equal, mutate, normal_weights


def history(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    w = {"a": normal_weights((64, 48), torch.bfloat16, rng), "b": normal_weights((300,), torch.bfloat16, rng)}
    out = []
    for _ in range(n):
        w = {k: mutate(t, 0.05, rng) for k, t in w.items()}  # random bits too: NaNs, infs, -0.0
        out.append(w)
    return out


@pytest.mark.parametrize("codec", ["pulse", "pulse-ctx"])
def test_every_retained_version_is_rebuilt_bit_for_bit(codec: str) -> None:
    versions = history(12)
    store = WeightStore(make_codec(codec), snapshot_every=4, retain=6, wire_dtype=torch.bfloat16)
    for v, w in enumerate(versions):
        store.publish(v, w)
    assert store.versions == (6, 7, 8, 9, 10, 11)
    for v in store.versions:
        assert bits_equal(store.weights_at(v), versions[v]), v
    with pytest.raises(LookupError, match="not retained"):
        store.weights_at(5)


def test_the_full_codec_has_only_the_newest_version() -> None:
    versions = history(3)
    store = WeightStore(make_codec("full"), wire_dtype=torch.bfloat16)
    for v, w in enumerate(versions):
        store.publish(v, w)
    assert bits_equal(store.weights_at(2), versions[2])
    with pytest.raises(LookupError, match="no patch record"):
        store.weights_at(1)


def test_revert_undoes_apply_and_merged_patches_revert_too() -> None:
    a, b, c = history(3, seed=1)
    p1 = encode_patch(a, b, base_version=0, new_version=1)
    p2 = encode_patch(b, c, base_version=1, new_version=2)
    w = {k: t.clone() for k, t in c.items()}
    revert_patch(w, merge_patches([p1, p2]))
    assert bits_equal(w, a)
    with pytest.raises(PatchError, match="tensor names differ"):
        revert_patch({"a": w["a"]}, p1)


def test_a_corrupted_record_is_caught_by_the_version_hash() -> None:
    versions = history(4)
    store = WeightStore(make_codec("pulse"), snapshot_every=100, wire_dtype=torch.bfloat16)
    for v, w in enumerate(versions):
        store.publish(v, w)
    store._records[2] = store._records[3]  # the wrong patch for version 2
    with pytest.raises(PatchError, match="does not hash to its published hash"):
        store.weights_at(1)
