"""PULSE v2 (context-coded) patches: bit-exact round trips, classes in use, segments, re-coding, refusals."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heterorl.weights import PatchError, apply_patch, encode_patch, merge_patches, patch_info, state_hash
from heterorl.weights.ctxpatch import SEGMENT_MIN, group
from heterorl.weights.format import CTX_FORMAT_VERSION, FORMAT_VERSION, bits_view, unpack
from heterorl.weights.patch import encode_patches, recode_patch

from ._helpers import DTYPES, bits_equal, clone, mutate, normal_weights, random_bits
from .test_patch import changed_count, weight_pairs


def adam_like_step(
    shapes: dict[str, tuple[int, ...]], lr: float, seed: int, dtype: torch.dtype = torch.bfloat16
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """fp32 masters ~ N(0, 0.02) minus lr * N(0, 1), both viewed in `dtype` (small weights change most)."""
    gen = torch.Generator().manual_seed(seed)
    base, new = {}, {}
    for name, shape in shapes.items():
        master = torch.randn(shape, generator=gen) * 0.02
        base[name] = master.to(dtype)
        new[name] = (master - lr * torch.randn(shape, generator=gen)).to(dtype)
    return base, new


@st.composite
def large_pairs(draw: st.DrawFn) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Tensors large enough for magnitude classes: Adam-like steps, plus arbitrary bit changes on top."""
    seed = draw(st.integers(0, 2**32 - 1))
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(4096, 40_000))
    shapes = {"a.weight": (n,), "b.weight": (draw(st.integers(1, 64)), 97)}
    base, new = adam_like_step(shapes, draw(st.sampled_from([1e-6, 1e-5, 1e-4])), seed, dtype)
    rng = np.random.default_rng(seed)
    extra = draw(st.sampled_from([0.0, 0.001, 0.05]))
    new = {k: mutate(v, extra, rng, draw(st.sampled_from(["ulp", "random", "mixed"]))) for k, v in new.items()}
    return base, new


def round_trip(base: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> bytes:
    patch = encode_patch(base, new, context=True)
    info = patch_info(patch)
    assert info.format_version == CTX_FORMAT_VERSION
    assert info.changed == changed_count(base, new)
    assert (info.base_hash, info.result_hash) == (state_hash(base), state_hash(new))
    weights = clone(base)
    apply_patch(weights, patch)
    assert bits_equal(weights, new)
    return patch


@settings(max_examples=80, deadline=None)
@given(weight_pairs())
def test_round_trip_is_bit_exact_on_arbitrary_bits(pair):
    round_trip(*pair)


@settings(max_examples=40, deadline=None)
@given(large_pairs())
def test_round_trip_is_bit_exact_with_classes(pair):
    round_trip(*pair)


def test_classes_are_used_and_pay_on_an_adam_step():
    base, new = adam_like_step({"w1": (600, 512), "w2": (512, 600)}, 1e-6, seed=0)
    patch = round_trip(base, new)
    header = unpack(patch).header
    assert all(len(seg["bounds"]) >= 3 for seg in header["segments"])
    v1 = encode_patch(base, new)
    assert len(patch) < 0.8 * len(v1)  # measured ~0.7 (docs/weight-sync.md)


def test_special_values_and_integer_dtypes():
    rng = np.random.default_rng(5)
    base = {
        "f16": random_bits((5000,), torch.float16, rng),  # NaNs, infs, subnormals, -0.0 among classed values
        "i8": torch.from_numpy(rng.integers(-128, 128, 7000, dtype=np.int8)),
        "i32": torch.from_numpy(rng.integers(-(2**31), 2**31, 5000, dtype=np.int32)),
        "flag": torch.from_numpy(rng.random(6000) < 0.5),
        "scalar": torch.tensor(1.5, dtype=torch.bfloat16),
    }
    new = {k: mutate(v, 0.05, rng) if k != "flag" else ~v for k, v in base.items()}
    new["scalar"] = torch.tensor(-0.0, dtype=torch.bfloat16)
    round_trip(base, new)


def test_small_tensors_share_segments():
    rng = np.random.default_rng(6)
    base = {f"norm{i:02d}.weight": 1 + normal_weights((256,), torch.bfloat16, rng) for i in range(40)}
    base["big.weight"] = normal_weights((SEGMENT_MIN,), torch.bfloat16, rng)
    base["f32.bias"] = normal_weights((100,), torch.float32, rng)
    new = {k: mutate(v, 0.1, rng, "ulp") for k, v in base.items()}
    layouts = [(n, base[n].dtype, tuple(base[n].shape)) for n in sorted(base)]
    sizes = [len(g) for g in group(layouts)]
    assert sizes == [1, 1, 40]  # big alone, the fp32 bias apart (dtype), the norms together
    patch = round_trip(base, new)
    assert [seg["size"] for seg in unpack(patch).header["segments"]] == sizes


def test_encode_patches_gives_both_formats_from_one_diff():
    base, new = adam_like_step({"w": (300, 64)}, 1e-5, seed=2)
    v1, v2 = encode_patches(base, new, versions=(3, 4))
    assert v1 == encode_patch(base, new, base_version=3, new_version=4)
    assert v2 == encode_patch(base, new, base_version=3, new_version=4, context=True)
    assert (patch_info(v1).format_version, patch_info(v2).format_version) == (FORMAT_VERSION, CTX_FORMAT_VERSION)


def test_recode_turns_a_merged_chain_into_v2():
    versions = [adam_like_step({"w": (200, 100)}, 1e-5, seed=3)[0]]
    for i in range(3):
        versions.append({k: (v.float() - 1e-5 * (i + 1)).bfloat16() for k, v in versions[-1].items()})
    records = [
        encode_patch(a, b, base_version=i, new_version=i + 1) for i, (a, b) in enumerate(itertools.pairwise(versions))
    ]
    merged = merge_patches(records)
    recoded = recode_patch(merged, versions[-1])
    info = patch_info(recoded)
    assert (info.base_version, info.result_version, info.format_version) == (0, 3, CTX_FORMAT_VERSION)
    weights = clone(versions[0])
    apply_patch(weights, recoded)
    assert bits_equal(weights, versions[-1])
    with pytest.raises(PatchError, match="not the patch's result"):
        recode_patch(merged, versions[-2])
    with pytest.raises(PatchError, match="only v1"):
        merge_patches([recoded])
    with pytest.raises(PatchError, match="takes a v1"):
        recode_patch(recoded, versions[-1])


def test_wrong_base_and_second_application_are_refused():
    base, new = adam_like_step({"w": (300, 100)}, 1e-5, seed=4)
    patch = encode_patch(base, new, context=True)
    other = clone(new)
    bits_view(other["w"])[0] ^= 1
    for weights in (clone(new), other):
        before = clone(weights)
        with pytest.raises(PatchError):
            apply_patch(weights, patch)
        assert bits_equal(weights, before)


def test_v1_patches_still_decode_next_to_v2():
    base, new = adam_like_step({"w": (300, 100)}, 1e-5, seed=5)
    for context in (False, True):
        weights = clone(base)
        apply_patch(weights, encode_patch(base, new, context=context))
        assert bits_equal(weights, new)


def test_the_accelerator_encode_path_gives_the_same_bytes(monkeypatch):
    """torch ops (diff, classes, flags) as on a GPU, run here on CPU tensors: byte-identical patches."""
    from heterorl.weights import patch as patch_module

    base, new = adam_like_step({"a.weight": (300, 200), "b.bias": (100,), "c.bias": (90,)}, 1e-5, seed=7)
    new["d.int"] = torch.arange(20, dtype=torch.int32)
    base["d.int"] = torch.arange(20, dtype=torch.int32).flip(0)
    host = encode_patches(base, new, versions=(1, 2))
    monkeypatch.setattr(patch_module, "DEVICE_PATH_ON_CPU", True)
    assert encode_patches(base, new, versions=(1, 2)) == host


def test_threads_split_large_tensors_and_change_nothing():
    """A tensor above PARALLEL_MIN is enumerated in position ranges by several threads: same members, same
    bytes, same result."""
    from heterorl.weights.classes import PARALLEL_MIN, members

    base, new = adam_like_step({"big": (PARALLEL_MIN + 1001,), "small": (5000,)}, 1e-5, seed=8)
    bits = bits_view(base["big"])
    bounds = [(127 - e) << 7 for e in (14, 12, 10, 9)]
    changed = bits != bits_view(new["big"])
    one, two = members(bits, 0x7FFF, bounds, changed), members(bits, 0x7FFF, bounds, changed, workers=3)
    for a, b in zip(one, two, strict=True):
        assert np.array_equal(a.at(np.arange(a.size)), b.at(np.arange(b.size)))
        assert np.array_equal(a.changed, b.changed)
    patch = encode_patch(base, new, context=True)
    assert encode_patch(base, new, context=True, workers=2) == patch
    weights = clone(base)
    apply_patch(weights, patch, workers=2)
    assert bits_equal(weights, new)
