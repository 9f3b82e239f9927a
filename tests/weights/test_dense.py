"""PULSE's dense tensor layout (weights/dense.py): one code stream of every element, chosen for a tensor most of
whose elements changed. Bit-exact round trips on arbitrary bits, the compiled kernels equal to the numpy
reference byte for byte, one choice whether the encoder holds the tensors or their changes (a merge writes what
one step would), and hostile headers refused with the weights untouched."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from heterorl.weights import PatchError, apply_patch, dense, encode_patch, merge_patches, native
from heterorl.weights.diffscan import scan_numpy
from heterorl.weights.format import UINT, pack, unpack
from heterorl.weights.intcode import StreamSpec, decompress_exact
from heterorl.weights.patch import encode_versions, patch_info

from ._helpers import bits_equal, clone

DTYPES = {1: torch.uint8, 2: torch.bfloat16, 4: torch.float32, 8: torch.float64}


@st.composite
def dense_pairs(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    """(base, new) raw bits of any width, most elements changed (some by a little, some to anything)."""
    itemsize = draw(st.sampled_from([1, 2, 4, 8]))
    n = draw(st.integers(1, 2500))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = UINT[itemsize]
    base = rng.integers(0, np.iinfo(dtype).max, n, dtype=dtype, endpoint=True)
    new = base.copy()
    moved = rng.random(n) < draw(st.sampled_from([0.0, 0.3, 0.65, 0.9, 1.0]))
    small = rng.integers(-3, 4, n).astype(np.int64).astype(dtype)  # wraps like the bits do
    new[moved] += small[moved]
    wild = moved & (rng.random(n) < 0.1)
    new[wild] = rng.integers(0, np.iinfo(dtype).max, int(wild.sum()), dtype=dtype, endpoint=True)
    return base, new


def layouts(patch: bytes) -> list[str]:
    return [t.get("layout", "sparse") for t in unpack(patch).header["tensors"]]


def as_weights(bits: np.ndarray) -> dict[str, torch.Tensor]:
    return {"w": torch.from_numpy(bits.copy()).view(DTYPES[bits.itemsize])}


@settings(max_examples=120, deadline=None)
@given(dense_pairs(), st.booleans(), st.booleans())
def test_the_kernel_equals_the_reference_and_decodes_to_the_sparse_scans_changes(pair, hash_base, hash_new):
    base, new = pair
    ref = dense.codes_numpy(base, new, hash_base, hash_new)
    got = native.dense_codes(base, new, hash_base, hash_new)
    np.testing.assert_array_equal(got[0], ref[0])
    assert got[0].dtype == ref[0].dtype
    assert got[1:] == ref[1:]
    pos, delta, db, dn = scan_numpy(base, new, hash_base, hash_new)
    assert ref[1] == pos.size
    assert (ref[2], ref[3]) == (db, dn)
    coded = []
    for flag in (False, True):
        with native.use(flag):
            coded.append(dense.encode(ref[0], ref[1], 1))
    assert coded[0] == coded[1]
    fields, frame = coded[0]
    spec = StreamSpec.from_json(fields["values"], base.size, base.itemsize * 8)
    raw = decompress_exact(memoryview(frame), fields["raw_nbytes"], "w")
    for flag in (False, True):
        with native.use(flag):
            got_pos, got_delta = dense.decode(raw, base.size, spec, UINT[base.itemsize], ref[1], "w")
        np.testing.assert_array_equal(got_pos, pos)
        np.testing.assert_array_equal(got_delta, delta)
        assert got_delta.dtype == delta.dtype


@settings(max_examples=80, deadline=None)
@given(dense_pairs())
def test_dense_patches_round_trip_bit_for_bit_with_the_same_bytes_either_way(pair):
    with pytest.MonkeyPatch.context() as mp:  # tensors this small stay sparse by default: let them go dense here
        mp.setattr(dense, "DENSE_MIN_NUMEL", 1)
        round_trip(*pair)


def round_trip(base_bits: np.ndarray, new_bits: np.ndarray) -> None:
    base, new = as_weights(base_bits), as_weights(new_bits)
    patches = []
    for flag in (False, True):
        with native.use(flag):
            patches.append(encode_patch(base, new))
    assert patches[0] == patches[1]
    chosen = dense.is_dense(base_bits, new_bits)
    assert layouts(patches[0]) == ["dense" if chosen else "sparse"]
    for flag in (False, True):
        weights = clone(base)
        with native.use(flag):
            apply_patch(weights, patches[0])
        assert bits_equal(weights, new)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 200_000), st.floats(0.0, 1.0), st.integers(0, 2**32 - 1))
def test_the_choice_is_the_same_from_the_tensors_and_from_their_changes(numel, rate, seed):
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 2**16, numel, dtype=np.uint16)
    new = base.copy()
    moved = rng.random(numel) < rate
    new[moved] += 1
    assert dense.is_dense(base, new) == dense.is_dense_changes(np.flatnonzero(moved), numel)


def steps(rate: float, n: int = 3, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """n + 1 versions of a bf16 model whose every step moves `rate` of the weights by about one ULP."""
    gen = torch.Generator().manual_seed(seed)
    w = {"a": torch.randn(300, 400, generator=gen) * 0.02, "b": torch.randn(70_000, generator=gen) * 0.02}
    out = [{k: v.bfloat16() for k, v in w.items()}]
    for _ in range(n):
        for v in w.values():
            v += 1e-4 * torch.randn(v.shape, generator=gen).sign() * (torch.rand(v.shape, generator=gen) < rate)
        out.append({k: v.bfloat16() for k, v in w.items()})
    return out


def test_a_merge_of_dense_steps_is_the_patch_of_one_step_over_them():
    versions = steps(0.9)
    chain = [encode_patch(a, b) for a, b in itertools.pairwise(versions)]
    assert all(patch_info(p).changed > 0.6 * patch_info(p).numel for p in chain)
    assert all(layouts(p) == ["dense", "dense"] for p in chain)
    merged = merge_patches(chain)
    assert merged == encode_patch(versions[0], versions[-1])
    weights = clone(versions[0])
    apply_patch(weights, merged)
    assert bits_equal(weights, versions[-1])


def test_at_a_dense_step_the_dense_layout_costs_no_more_bytes_than_the_sparse_one(monkeypatch):
    """What the rule trades: a ~70% step coded both ways (the dense layout switched off by a share above 1)."""
    base, new = steps(0.85, n=1)
    coded = encode_versions(base, new, formats=(1,))
    monkeypatch.setattr(dense, "DENSE_SHARE", 2.0)
    sparse = encode_versions(base, new, formats=(1,))
    assert coded.v1 is not None
    assert sparse.v1 is not None
    assert coded.changed == sparse.changed > 0.6 * sum(t.numel() for t in base.values())
    assert layouts(coded.v1) == ["dense", "dense"]
    assert layouts(sparse.v1) == ["sparse", "sparse"]
    assert len(coded.v1) <= len(sparse.v1)
    assert abs(coded.estimated_nbytes - len(coded.v1)) <= 0.1 * len(coded.v1)  # what the snapshot choice reads


def _forge(patch: bytes, change) -> bytes:  # type: ignore[no-untyped-def]
    blob = unpack(patch)
    header = blob.header
    change(header["tensors"][0])
    return pack(header, [bytes(blob.payload)], blob.version)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda t: t.update(count=t["count"] - 1), "changed elements than the header says"),
        (lambda t: t.update(count=t["count"] + 1), "changed elements than the header says"),
        (lambda t: t.update(raw_nbytes=t["raw_nbytes"] - 2), "code stream needs"),
        (lambda t: t.update(layout="columns"), "unknown layout"),
        (lambda t: t.pop("values"), "stream spec must be an object"),
        (lambda t: t["values"].update(escapes=t["values"]["escapes"] + 1), "code stream needs|escape"),
    ],
    ids=["count low", "count high", "raw size", "layout", "no stream", "escapes"],
)
@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "reference"])
def test_a_dense_tensor_whose_header_lies_is_refused_and_nothing_is_written(change, reason, kernels):
    base, new = steps(0.9, n=1)
    forged = _forge(encode_patch(base, new), change)
    weights = clone(base)
    with native.use(kernels), pytest.raises(PatchError, match=reason):
        apply_patch(weights, forged)
    assert bits_equal(weights, base)


@settings(max_examples=60, deadline=None)
@given(dense_pairs())
def test_the_accelerator_path_gives_the_same_bytes(pair):
    """torch ops as on a GPU (the codes and the sample computed where the weights live), run here on CPU
    tensors: the same choice and the same bytes as the host's kernel, at every width and at the extremes of
    two's complement."""
    from heterorl.weights import patch as patch_module

    base, new = as_weights(pair[0]), as_weights(pair[1])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dense, "DENSE_MIN_NUMEL", 1)
        host = encode_patch(base, new)
        mp.setattr(patch_module, "DEVICE_PATH_ON_CPU", True)
        assert encode_patch(base, new) == host
