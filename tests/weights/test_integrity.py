"""Damaged or malicious blobs: every one raises PatchError and leaves the weights untouched."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import zstandard as zstd

from heterorl.weights import (
    PatchError,
    apply_patch,
    apply_snapshot,
    encode_patch,
    encode_snapshot,
    load_snapshot,
    staged,
)
from heterorl.weights.format import CTX_FORMAT_VERSION, PREFIX, pack, unpack

from ._helpers import bits_equal, clone, mutate, normal_weights


@pytest.fixture(scope="module")
def pair() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    rng = np.random.default_rng(3)
    base = {
        "embed": normal_weights((64, 48), torch.bfloat16, rng),
        "norm": normal_weights((48,), torch.float32, rng),
        "scalar": normal_weights((), torch.float16, rng),
    }
    new = {k: mutate(v, 0.05, rng) for k, v in base.items()}
    new["scalar"] = -base["scalar"]
    return base, new


def assert_rejected(weights: dict[str, torch.Tensor], blob: bytes, apply=apply_patch) -> None:
    before = clone(weights)
    with pytest.raises(PatchError):
        apply(weights, blob)
    assert bits_equal(weights, before)


def sample_positions(n: int, head: int, count: int, seed: int) -> list[int]:
    """Every position in the first `head` bytes (prefix and header) plus a sample of the rest."""
    rng = np.random.default_rng(seed)
    rest = rng.choice(np.arange(head, n), size=min(count, n - head), replace=False) if n > head else []
    return sorted({*range(min(head, n)), *map(int, rest)})


@pytest.fixture(scope="module")
def pair_v2() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A tensor with magnitude classes and a segment of three small tensors of another dtype."""
    gen = torch.Generator().manual_seed(8)
    master = torch.randn(20_000, generator=gen) * 0.02
    base = {"big": master.bfloat16(), **{f"small{i}": (1 + master[i::97][:150]).half() for i in range(3)}}
    new = {"big": (master - 1e-5 * torch.randn(20_000, generator=gen)).bfloat16()}
    new |= {k: mutate(v, 0.1, np.random.default_rng(9), "ulp") for k, v in base.items() if k != "big"}
    return base, new


@pytest.mark.parametrize("kind", ["patch", "patch-v2", "snapshot"])
def test_every_truncation_and_single_byte_corruption_is_caught(pair, pair_v2, kind):
    base, new = pair_v2 if kind == "patch-v2" else pair
    if kind == "patch":
        blob, apply = encode_patch(base, new), apply_patch
    elif kind == "patch-v2":
        blob, apply = encode_patch(base, new, context=True), apply_patch
        assert len(unpack(blob).header["segments"]) == 2
        assert unpack(blob).header["segments"][0]["bounds"]
    else:
        blob, apply = encode_snapshot(new), apply_snapshot
    header_end = PREFIX.size + PREFIX.unpack_from(blob, 0)[2]
    weights = clone(base)
    rng = np.random.default_rng(4)
    for cut in sample_positions(len(blob), header_end, 150, seed=5):
        assert_rejected(weights, blob[:cut], apply)
    assert_rejected(weights, blob + b"\0", apply)
    for pos in sample_positions(len(blob), header_end, 250, seed=6):
        damaged = bytearray(blob)
        damaged[pos] ^= int(rng.integers(1, 256))
        assert_rejected(weights, bytes(damaged), apply)
    apply(weights, blob)  # the intact blob still works after all that
    assert bits_equal(weights, new)


def _tensor(header: dict, name: str) -> dict:
    return next(t for t in header["tensors"] if t["name"] == name)


MALICIOUS_HEADERS = {
    "kind": lambda h: h.update(kind="snapshot"),
    "base_hash_format": lambda h: h.update(base_hash="xyz"),
    "result_hash": lambda h: h.update(result_hash="0" * 32),
    "version_type": lambda h: h.update(result_version="3"),
    "tensors_type": lambda h: h.update(tensors={}),
    "unsorted_names": lambda h: h["tensors"].reverse(),
    "unknown_dtype": lambda h: _tensor(h, "embed").update(dtype="float8"),
    "dtype_swap": lambda h: _tensor(h, "norm").update(dtype="int32"),
    "shape": lambda h: _tensor(h, "embed").update(shape=[48, 64]),
    "negative_dim": lambda h: _tensor(h, "embed").update(shape=[-64, -48]),
    "huge_shape": lambda h: _tensor(h, "embed").update(shape=[2**40, 2**40]),
    "count_up": lambda h: _tensor(h, "embed").update(count=_tensor(h, "embed")["count"] + 1),
    "count_bool": lambda h: _tensor(h, "embed").update(count=True),
    "count_over_numel": lambda h: _tensor(h, "scalar").update(count=2),
    "raw_nbytes": lambda h: _tensor(h, "embed").update(raw_nbytes=_tensor(h, "embed")["raw_nbytes"] - 1),
    "offset": lambda h: _tensor(h, "norm").update(offset=_tensor(h, "norm")["offset"] + 1),
    "nbytes": lambda h: _tensor(h, "embed").update(nbytes=_tensor(h, "embed")["nbytes"] - 1),
    "k_seven": lambda h: _tensor(h, "embed")["gaps"].update(k=7),
    "k_range": lambda h: _tensor(h, "embed")["values"].update(k=40),
    "k_changed": lambda h: _tensor(h, "embed")["gaps"].update(k=_tensor(h, "embed")["gaps"]["k"] + 1),
    "escapes": lambda h: _tensor(h, "embed")["gaps"].update(
        escapes=_tensor(h, "embed")["gaps"]["escapes"] + 1, escape_width=1
    ),
    "escape_width": lambda h: _tensor(h, "embed")["values"].update(escape_width=3),
    "missing_spec": lambda h: _tensor(h, "embed").pop("values"),
    "float_field": lambda h: _tensor(h, "embed").update(count=1.5),
}


def _seg(header: dict, i: int = 0) -> dict:
    return header["segments"][i]


def _cls(header: dict, c: int) -> dict:
    return _seg(header)["classes"][c]


MALICIOUS_V2_HEADERS = {
    "segments_type": lambda h: h.update(segments={}),
    "segment_size_zero": lambda h: _seg(h).update(size=0),
    "segment_size_over": lambda h: _seg(h, 1).update(size=5),
    "segments_missing": lambda h: h["segments"].pop(),
    "tensor_count": lambda h: h["tensors"][0].update(count=h["tensors"][0]["count"] + 1),
    "tensor_counts_swapped": lambda h: (
        h["tensors"][1].update(count=h["tensors"][1]["count"] + 1),
        h["tensors"][2].update(count=h["tensors"][2]["count"] - 1),
        None,
    )[-1],
    "bounds_unsorted": lambda h: _seg(h)["bounds"].reverse(),
    "bounds_zero": lambda h: _seg(h)["bounds"].__setitem__(0, 0),
    "bounds_over_mask": lambda h: _seg(h)["bounds"].__setitem__(-1, 0x8000),
    "bounds_float": lambda h: _seg(h)["bounds"].__setitem__(0, 1.5),
    "bounds_shifted": lambda h: _seg(h)["bounds"].__setitem__(-1, _seg(h)["bounds"][-1] + 128),
    "bounds_dropped": lambda h: _seg(h)["bounds"].pop(0),
    "classes_dropped": lambda h: _seg(h)["classes"].pop(0),
    "members": lambda h: _cls(h, 0).update(m=_cls(h, 0)["m"] + 1),
    "class_count_moved": lambda h: (
        _cls(h, 0).update(n=_cls(h, 0)["n"] - 1),
        _cls(h, -1).update(n=_cls(h, -1)["n"] + 1),
    ),
    "mode_unknown": lambda h: _cls(h, -1).update(p="runs"),
    "value_mode": lambda h: _cls(h, -1).update(v="int", x=[0, 0, 0]),
    "spec_shape": lambda h: _cls(h, -1).update(g=[1, 2]),
    "spec_k": lambda h: _cls(h, -1).update(g=[7, 0, 0]),
    "raw_nbytes": lambda h: _seg(h).update(raw_nbytes=_seg(h)["raw_nbytes"] + 1),
    "seg_offset": lambda h: _seg(h, 1).update(offset=_seg(h, 1)["offset"] + 1),
    "classes_on_ints": lambda h: h["tensors"][0].update(dtype="int16"),
}


@pytest.mark.parametrize("edit", list(MALICIOUS_V2_HEADERS.values()), ids=list(MALICIOUS_V2_HEADERS))
def test_validly_signed_but_malformed_v2_headers_are_rejected(pair_v2, edit):
    base, new = pair_v2
    blob = unpack(encode_patch(base, new, context=True))
    header = copy.deepcopy(blob.header)
    edit(header)
    assert_rejected(clone(base), pack(header, [bytes(blob.payload)], CTX_FORMAT_VERSION))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_bad_later_segment_reverts_the_tensors_written_before_it(pair_v2, workers, monkeypatch):
    """Segments are decoded and written in place one after the other: counts that do not add up in the small
    tensors' segment fail after the big tensor was written, which must then be reverted."""
    written: list[int] = []
    real = staged.apply_changes
    monkeypatch.setattr(staged, "apply_changes", lambda tc: written.append(tc.view.size) or real(tc))
    base, new = pair_v2
    blob = unpack(encode_patch(base, new, context=True))
    header = copy.deepcopy(blob.header)
    MALICIOUS_V2_HEADERS["tensor_counts_swapped"](header)
    bad = pack(header, [bytes(blob.payload)], CTX_FORMAT_VERSION)
    assert_rejected(clone(base), bad, apply=lambda w, b: apply_patch(w, b, workers=workers))
    if workers == 1:
        assert written == [20_000]  # the big tensor was written, and taken back


@pytest.mark.parametrize("edit", list(MALICIOUS_HEADERS.values()), ids=list(MALICIOUS_HEADERS))
def test_validly_signed_but_malformed_headers_are_rejected(pair, edit):
    """A correct checksum only proves the bytes are what some encoder wrote; the fields are still checked."""
    base, new = pair
    blob = unpack(encode_patch(base, new))
    header = copy.deepcopy(blob.header)
    edit(header)
    assert_rejected(clone(base), pack(header, [bytes(blob.payload)]))


def test_validly_signed_stream_corruption_is_rejected(pair):
    """Flip bytes inside a tensor's decompressed streams, recompress and re-sign: decoding must still catch it
    (bounds, escapes, padding, zero changes, or the result hash)."""
    base, new = pair
    blob = unpack(encode_patch(base, new))
    entry = next(t for t in blob.header["tensors"] if t["name"] == "embed")
    frame = bytes(blob.payload[entry["offset"] : entry["offset"] + entry["nbytes"]])
    raw = zstd.ZstdDecompressor().decompress(frame)
    rng = np.random.default_rng(7)
    weights = clone(base)
    for pos in rng.choice(len(raw), size=min(60, len(raw)), replace=False):
        damaged = bytearray(raw)
        damaged[pos] ^= int(rng.integers(1, 256))
        new_frame = zstd.ZstdCompressor(level=1).compress(bytes(damaged))
        header = copy.deepcopy(blob.header)
        delta = len(new_frame) - entry["nbytes"]
        for t in header["tensors"]:
            if t["name"] == "embed":
                t["nbytes"] = len(new_frame)
            elif t["offset"] > entry["offset"]:
                t["offset"] += delta
        payload = bytes(blob.payload)
        payload = payload[: entry["offset"]] + new_frame + payload[entry["offset"] + entry["nbytes"] :]
        assert_rejected(weights, pack(header, [payload]))


def test_snapshot_hash_is_checked_after_decoding(pair):
    _, new = pair
    blob = unpack(encode_snapshot(new))
    header = copy.deepcopy(blob.header)
    header["result_hash"] = "0" * 32
    with pytest.raises(PatchError, match="promises"):
        load_snapshot(pack(header, [bytes(blob.payload)]))


def test_wrong_kind_and_non_blobs(pair):
    base, new = pair
    with pytest.raises(PatchError, match="expected a patch"):
        apply_patch(clone(base), encode_snapshot(new))
    with pytest.raises(PatchError, match="expected a snapshot"):
        load_snapshot(encode_patch(base, new))
    for junk in (b"", b"HRLWSYNC", b"\0" * 100, b"PK\x03\x04" + b"\0" * 60):
        assert_rejected(clone(base), junk)
