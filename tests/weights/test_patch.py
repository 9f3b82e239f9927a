"""PULSE patches: bit-exact round trips, special values, base checks, merges, and rejection of bad blobs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heterorl.weights import PatchError, apply_patch, encode_patch, merge_patches, patch_info, state_hash
from heterorl.weights.format import bits_view

from ._helpers import DTYPES, bits_equal, clone, mutate, normal_weights, random_bits

shapes = st.one_of(
    st.just(()),
    st.lists(st.integers(0, 6), min_size=1, max_size=3).map(tuple),
    st.integers(0, 300).map(lambda n: (n,)),
)


@st.composite
def weight_pairs(draw: st.DrawFn) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    base, new = {}, {}
    for i in range(draw(st.integers(1, 3))):
        name = f"t{i}.weight"
        shape, dtype = draw(shapes), draw(st.sampled_from(DTYPES))
        base[name] = random_bits(shape, dtype, rng) if draw(st.booleans()) else normal_weights(shape, dtype, rng)
        rate = draw(st.sampled_from([0.0, 0.01, 0.2, 1.0]) | st.floats(0.0, 1.0))
        new[name] = mutate(base[name], rate, rng, draw(st.sampled_from(["ulp", "random", "mixed"])))
    return base, new


def changed_count(base: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> int:
    return sum(int((bits_view(base[k]) != bits_view(new[k])).sum()) for k in base)


@settings(max_examples=80, deadline=None)
@given(weight_pairs())
def test_round_trip_is_bit_exact(pair):
    base, new = pair
    patch = encode_patch(base, new)
    info = patch_info(patch)
    assert info.changed == changed_count(base, new)
    assert (info.base_hash, info.result_hash) == (state_hash(base), state_hash(new))
    weights = clone(base)
    apply_patch(weights, patch)
    assert bits_equal(weights, new)


# (dtype, unsigned view, +inf bits, quiet-NaN bits, sign bit, one)
SPECIALS = [
    (torch.bfloat16, np.uint16, 0x7F80, 0x7FC0, 0x8000, 0x3F80),
    (torch.float16, np.uint16, 0x7C00, 0x7E00, 0x8000, 0x3C00),
    (torch.float32, np.uint32, 0x7F800000, 0x7FC00000, 0x80000000, 0x3F800000),
]


@pytest.mark.parametrize(("dtype", "uint", "inf", "nan", "sign", "one"), SPECIALS, ids=["bf16", "fp16", "fp32"])
def test_special_values_compare_by_bits(dtype, uint, inf, nan, sign, one):
    base_bits = np.array([0, sign, nan, nan + 1, inf, inf | sign, one, nan], uint)
    new_bits = np.array([sign, 0, nan + 1, nan + 1, inf | sign, inf | sign, one, nan], uint)
    base = {"w": torch.from_numpy(base_bits.view(f"i{base_bits.itemsize}").copy()).view(dtype)}
    new = {"w": torch.from_numpy(new_bits.view(f"i{new_bits.itemsize}").copy()).view(dtype)}
    patch = encode_patch(base, new)
    assert patch_info(patch).changed == 4  # +0/-0 both ways, one NaN payload, +inf -> -inf
    weights = clone(base)
    apply_patch(weights, patch)
    assert np.array_equal(bits_view(weights["w"]), new_bits)


def test_unchanged_weights_give_an_empty_patch():
    rng = np.random.default_rng(0)
    base = {"a": normal_weights((64, 32), torch.bfloat16, rng), "b": torch.empty(0, 3, dtype=torch.float16)}
    patch = encode_patch(base, clone(base))
    assert patch_info(patch).changed == 0
    weights = clone(base)
    apply_patch(weights, patch)
    assert bits_equal(weights, base)


def test_encoding_is_deterministic_and_thread_count_independent():
    rng = np.random.default_rng(1)
    base = {f"w{i}": normal_weights((128, 64), torch.bfloat16, rng) for i in range(4)}
    new = {k: mutate(v, 0.05, rng) for k, v in base.items()}
    assert encode_patch(base, new) == encode_patch(base, new, workers=2)
    patch = encode_patch(base, new)
    weights = clone(base)
    apply_patch(weights, patch, workers=2)
    assert bits_equal(weights, new)


@pytest.fixture
def chain() -> list[dict[str, torch.Tensor]]:
    """Four versions; later steps revert some earlier changes and touch some positions repeatedly."""
    rng = np.random.default_rng(2)
    v0 = {"a": normal_weights((50, 40), torch.bfloat16, rng), "b": normal_weights((7,), torch.float32, rng)}
    versions = [v0]
    for _ in range(3):
        nxt = {k: mutate(t, 0.1, rng) for k, t in versions[-1].items()}
        reverted = rng.random(2000) < 0.05  # flip a share of "a" back to v0's bits
        bits_view(nxt["a"])[reverted] = bits_view(v0["a"])[reverted]
        versions.append(nxt)
    return versions


def test_wrong_base_is_rejected_and_untouched(chain):
    patch = encode_patch(chain[1], chain[2])
    weights = clone(chain[0])
    with pytest.raises(PatchError, match="applies to base"):
        apply_patch(weights, patch)
    assert bits_equal(weights, chain[0])
    weights = clone(chain[1])
    apply_patch(weights, patch)
    with pytest.raises(PatchError, match="applies to base"):  # a second application is caught too
        apply_patch(weights, patch)
    assert bits_equal(weights, chain[2])


@pytest.mark.parametrize("context", [False, True])
@pytest.mark.parametrize("where", ["unchanged", "changed"])
def test_a_base_one_bit_off_is_named_and_untouched(chain, context, where):
    """The apply checks the result's hash, not the base's: one bit off in the held weights, at an element the
    patch leaves alone or at one it changes, must still be caught, named as the wrong base, and every tensor
    written in place reverted."""
    patch = encode_patch(chain[1], chain[2], context=context)
    differs = bits_view(chain[1]["a"]) != bits_view(chain[2]["a"])
    at = int(np.flatnonzero(differs if where == "changed" else ~differs)[0])
    weights = clone(chain[1])
    bits_view(weights["a"])[at] ^= np.uint16(1)
    held = clone(weights)
    with pytest.raises(PatchError, match="applies to base"):
        apply_patch(weights, patch)
    assert bits_equal(weights, held)


@pytest.mark.parametrize("context", [False, True])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_failure_in_any_tensor_reverts_every_tensor_written(context, workers):
    """Tensors are written in place as they are decoded: a bad base in the first, a middle or the last tensor,
    caught by the result hash once all six were written, leaves all of them bit for bit as they were, in one
    thread or two (a decoder's error after earlier writes: test_integrity)."""
    rng = np.random.default_rng(5)
    base = {f"t{i}": normal_weights((64, 48), torch.bfloat16, rng) for i in range(6)}
    new = {k: mutate(t, 0.2, rng) for k, t in base.items()}
    patch = encode_patch(base, new, context=context)
    for bad in ("t0", "t3", "t5"):
        weights = clone(base)
        bits_view(weights[bad])[7:40] ^= np.uint16(0x0100)
        held = clone(weights)
        with pytest.raises(PatchError, match="applies to base"):
            apply_patch(weights, patch, workers=workers)
        assert bits_equal(weights, held), bad


def test_tensors_sharing_memory_are_refused_before_any_write():
    """A tied weight listed under two names would get its differences twice when written in place."""
    rng = np.random.default_rng(6)
    x = normal_weights((32, 16), torch.bfloat16, rng)
    y = mutate(x, 0.3, rng)
    patch = encode_patch({"embed": x, "head": x.clone()}, {"embed": y, "head": y.clone()})
    tied = x.clone()
    with pytest.raises(PatchError, match="'embed' and 'head' share memory"):
        apply_patch({"embed": tied, "head": tied}, patch)
    assert torch.equal(bits_view_t(tied), bits_view_t(x))
    weights = {"embed": x.clone(), "head": x.clone()}
    apply_patch(weights, patch)  # one tensor each: applied
    assert bits_equal(weights, {"embed": y, "head": y})


def bits_view_t(t: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(bits_view(t).copy())


@pytest.mark.parametrize(
    "edit",
    [
        lambda w: w.pop("b"),
        lambda w: w.__setitem__("c", torch.zeros(2)),
        lambda w: w.__setitem__("b", w["b"].double()),
        lambda w: w.__setitem__("a", w["a"].reshape(40, 50)),
    ],
    ids=["missing", "extra", "dtype", "shape"],
)
def test_layout_mismatch_is_rejected(chain, edit):
    patch = encode_patch(chain[0], chain[1])
    weights = clone(chain[0])
    edit(weights)
    before = clone(weights)
    with pytest.raises(PatchError):
        apply_patch(weights, patch)
    assert bits_equal(weights, before)


def test_non_contiguous_weights_are_refused(chain):
    patch = encode_patch(chain[0], chain[1])
    weights = clone(chain[0])
    weights["a"] = weights["a"].t().contiguous().t()  # same values and shape, transposed storage
    with pytest.raises(PatchError, match="contiguous"):
        apply_patch(weights, patch)


def test_merged_patch_equals_applying_the_chain(chain):
    steps = enumerate(itertools.pairwise(chain))
    patches = [encode_patch(a, b, base_version=i, new_version=i + 1) for i, (a, b) in steps]
    merged = merge_patches(patches)
    info = patch_info(merged)
    assert (info.base_version, info.result_version) == (0, 3)
    assert info.changed == changed_count(chain[0], chain[3])  # reverted positions are dropped
    assert info.changed < sum(patch_info(p).changed for p in patches)
    stepwise, at_once = clone(chain[0]), clone(chain[0])
    for p in patches:
        apply_patch(stepwise, p)
    apply_patch(at_once, merged)
    assert bits_equal(stepwise, chain[3])
    assert bits_equal(at_once, chain[3])
    assert merge_patches(patches[:1]) == patches[0]
    assert merge_patches([merge_patches(patches[:2]), patches[2]]) == merged


def test_merge_rejects_a_broken_chain(chain):
    with pytest.raises(PatchError, match="chain is broken"):
        merge_patches([encode_patch(chain[0], chain[1]), encode_patch(chain[2], chain[3])])
    with pytest.raises(ValueError, match="at least one"):
        merge_patches([])


def test_encode_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="different tensors"):
        encode_patch({"a": torch.zeros(2)}, {"b": torch.zeros(2)})
    with pytest.raises(ValueError, match="base is"):
        encode_patch({"a": torch.zeros(2)}, {"a": torch.zeros(3)})
    with pytest.raises(ValueError, match="not supported"):
        encode_patch({"a": torch.zeros(2, dtype=torch.complex64)}, {"a": torch.zeros(2, dtype=torch.complex64)})
