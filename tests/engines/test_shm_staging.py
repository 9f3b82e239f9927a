"""Weight updates through shared memory (no vLLM needed): staging, mapping, digests, finiteness, manifests."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from heterorl.engines.shm_staging import (
    ALIGN,
    CHUNK,
    Entry,
    MappedBuffer,
    NonFiniteError,
    StagingBuffer,
    copy_digest_finite,
    corrupted,
    update_problems,
)
from heterorl.engines.vllm_engine import request_seed

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


@pytest.fixture
def staging() -> StagingBuffer:
    buffer = StagingBuffer()
    yield buffer
    buffer.close()


def mapped(staging: StagingBuffer, manifest: list[Entry]) -> dict[str, tuple[Entry, torch.Tensor]]:
    reader = MappedBuffer()
    reader.attach(staging.path, staging.size)
    return reader.tensors([e.to_wire() for e in manifest])


@settings(max_examples=30, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 40), min_size=0, max_size=3), min_size=1, max_size=5),
    dtypes=st.lists(st.sampled_from(DTYPES), min_size=5, max_size=5),
    seed=st.integers(0, 2**31),
)
def test_staged_tensors_arrive_bit_for_bit(shapes: list[list[int]], dtypes: list[torch.dtype], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    tensors = {
        f"t{i}": torch.randn(shape, generator=gen).to(dtype)
        for i, (shape, dtype) in enumerate(zip(shapes, dtypes[: len(shapes)], strict=True))
    }
    staging = StagingBuffer()
    try:
        manifest = staging.stage(tensors)
        arrived = mapped(staging, manifest)
        assert corrupted(arrived) == []
        for entry in manifest:
            assert entry.offset % ALIGN == 0
            view = arrived[entry.name][1]
            sent = tensors[entry.name]
            assert view.dtype == sent.dtype
            assert view.shape == sent.shape
            assert torch.equal(view.reshape(-1).view(torch.uint8), sent.reshape(-1).view(torch.uint8))  # bits
            assert entry.digest == xxhash.xxh3_64_hexdigest(sent.reshape(-1).view(torch.uint8).numpy())
    finally:
        staging.close()


def test_one_flipped_bit_is_caught_in_its_tensor(staging: StagingBuffer) -> None:
    tensors = {"a": torch.randn(300, 700).bfloat16(), "b": torch.randn(CHUNK).float(), "c": torch.randn(5).half()}
    manifest = staging.stage(tensors)
    arrived = mapped(staging, manifest)
    for entry in manifest:
        for byte in (0, entry.nbytes // 2, entry.nbytes - 1):
            staging.bytes[entry.offset + byte] ^= 0x01
            assert corrupted(arrived) == [entry.name]
            staging.bytes[entry.offset + byte] ^= 0x01
    assert corrupted(arrived) == []


@pytest.mark.parametrize(
    ("dtype", "int_type", "largest_finite", "infinity", "nan"),
    [
        (torch.bfloat16, torch.int16, 0x7F7F, 0x7F80, 0x7FC0),
        (torch.float16, torch.int16, 0x7BFF, 0x7C00, 0x7E00),
        (torch.float32, torch.int32, 0x7F7FFFFF, 0x7F800000, 0x7FC00000),
    ],
)
def test_finiteness_is_read_from_the_exponent_bits(
    dtype: torch.dtype, int_type: torch.dtype, largest_finite: int, infinity: int, nan: int
) -> None:
    """The largest finite value (either sign) passes; +-infinity and NaN anywhere (also past the first chunk) fail."""
    sign = -(1 << (torch.iinfo(int_type).bits - 1))  # the sign bit as a signed integer
    n = 3 * CHUNK // torch.finfo(dtype).bits * 8 + 7  # more than one chunk, not a whole number of them
    base = torch.zeros(n, dtype=int_type)
    base[::97] = largest_finite
    base[1::97] = largest_finite | sign
    name = str(dtype).removeprefix("torch.")
    dst = np.empty(base.numel() * base.element_size(), dtype=np.uint8)
    _, finite = copy_digest_finite(base.view(torch.uint8).numpy(), dst, name)
    assert finite
    assert torch.isfinite(base.view(dtype)).all()
    for bits in (infinity, infinity | sign, nan, nan | sign):
        for where in (0, n // 2, n - 1):
            bad = base.clone()
            bad[where] = bits
            digest, finite = copy_digest_finite(bad.view(torch.uint8).numpy(), dst, name)
            assert not finite, (hex(bits), where)
            assert np.array_equal(dst, bad.view(torch.uint8).numpy())
            assert digest == xxhash.xxh3_64_hexdigest(dst)


def test_non_finite_tensors_are_named(staging: StagingBuffer) -> None:
    tensors = {"ok": torch.ones(4), "nan": torch.tensor([1.0, float("nan")]), "inf": torch.tensor([float("-inf")])}
    with pytest.raises(NonFiniteError, match=r"2 tensors hold NaN or infinity, e.g. \['nan', 'inf'\]"):
        staging.stage({k: v.bfloat16() for k, v in tensors.items()})
    with pytest.raises(ValueError, match="float64 cannot be staged"):
        staging.stage({"x": torch.ones(2, dtype=torch.float64)})


def test_the_buffer_grows_and_the_name_is_unlinked_once_mapped(staging: StagingBuffer) -> None:
    staging.stage({"a": torch.ones(10)})
    first = staging.path
    assert first is not None
    assert Path(first).exists()
    reader = MappedBuffer()
    reader.attach(first, staging.size)
    staging.worker_mapped()
    assert not Path(first).exists()  # the memory lives on in both mappings
    manifest = staging.stage({"a": torch.full((10,), 2.0)})
    assert staging.path == first
    assert torch.equal(reader.tensors([e.to_wire() for e in manifest])["a"][1], torch.full((10,), 2.0))
    old_size = staging.size
    big = {"a": torch.arange(3 * old_size // 4, dtype=torch.float32)}
    manifest = staging.stage(big)  # does not fit: a new file
    assert staging.path != first
    assert staging.size >= 3 * old_size
    reader.attach(staging.path, staging.size)
    assert torch.equal(reader.tensors([e.to_wire() for e in manifest])["a"][1], big["a"])
    with pytest.raises(ValueError, match=r"has .* bytes, expected"):
        MappedBuffer().attach(staging.path, staging.size + 1)


def test_bad_manifests_are_refused(staging: StagingBuffer) -> None:
    manifest = staging.stage({"a": torch.ones(64), "b": torch.ones(64)})
    reader = MappedBuffer()
    with pytest.raises(ValueError, match="no staging buffer is mapped"):
        reader.tensors([e.to_wire() for e in manifest])
    reader.attach(staging.path, staging.size)
    a, b = (e.to_wire() for e in manifest)
    cases = {
        "not a list": "a",
        r"not \[name, dtype, shape, offset, digest\]": [["a", "float32", [64], 0]],
        "bad name, dtype": [["a", "int64", [64], 0, a[4]]],
        "bad shape": [["a", "float32", [-1], 0, a[4]]],
        "bad offset": [["a", "float32", [64], 3, a[4]]],
        "overlap or leave the buffer": [["a", "float32", [64], staging.size - 64, a[4]]],
        "appears twice": [a, ["a", *b[1:]]],
    }
    for message, bad in cases.items():
        with pytest.raises(ValueError, match=message):
            reader.tensors(bad)
    with pytest.raises(ValueError, match="overlap"):
        reader.tensors([a, ["b", "float32", [64], a[3] + 64 * 4 - ALIGN, b[4]]])
    with pytest.raises(ValueError, match="bad staging buffer"):
        reader.attach(None, 10)


def test_update_problems_name_what_did_not_land() -> None:
    clean = {"mismatched": [], "stale": [], "probed": 10}
    assert update_problems(clean) == []
    assert update_problems({**clean, "mismatched": ["a", "b"]}) == ["2 tensors not held as sent, e.g. ['a', 'b']"]
    assert "1 layers compute with other weights" in update_problems({**clean, "stale": ["lm_head"]})[0]
    assert update_problems({**clean, "probed": 0}) == ["no linear layer could be probed"]


def test_request_seeds_give_every_completion_its_own_seed() -> None:
    """Request n's completions use seeds s .. s + n - 1 (vLLM's fan-out); ranges of different requests and engine
    seeds do not meet."""
    assert request_seed(0, 0) == 0
    assert request_seed(0, 1) == 1 << 16
    assert request_seed(2, 3) == (2 * 1_000_003 + 3) << 16
    starts = sorted(request_seed(seed, n) for seed in range(3) for n in range(1000))
    assert all(b - a >= 1 << 16 for a, b in itertools.pairwise(starts))
    assert max(starts) < 2**63
