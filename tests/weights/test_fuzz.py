"""Fuzzing every receiving path with mutated patches (v1, v2, merged, re-coded) and snapshots.

Every mutated blob must either be refused with PatchError and leave the weights bit-for-bit untouched, or be
accepted and produce exactly the intended weights (a mutation may be harmless, e.g. a re-signed version
number). Mutations: truncations and extensions, random byte flips anywhere, header fields replaced by values of
every JSON type (huge and negative numbers, 5000-digit integers, deep nesting, wrong types, missing and extra
keys) and re-signed with a valid checksum, stream bytes corrupted inside a frame that is recompressed and
re-signed, and WeightReceiver updates whose blobs or promised version/hash were tampered with.

`pytest -m slow -s tests/weights/test_fuzz.py` runs 10,000+ cases and prints the tally; the default suite runs
a few hundred.
"""

from __future__ import annotations

import collections
import copy
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import zstandard as zstd

from heterorl.weights import (
    PatchError,
    Update,
    WeightReceiver,
    apply_patch,
    apply_snapshot,
    encode_patch,
    encode_snapshot,
    load_snapshot,
    merge_patches,
    state_hash,
)
from heterorl.weights.format import MAGIC, PREFIX, pack, unpack
from heterorl.weights.patch import recode_patch

from ._helpers import bits_equal, clone, mutate

StateDict = dict[str, torch.Tensor]


def _versions(seed: int = 0) -> list[StateDict]:
    """Four versions of a small model: a classed bf16 matrix, small bf16/fp16 tensors, an fp32 and an int."""
    gen = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    master = {"w": torch.randn(96, 64, generator=gen) * 0.02, "b": torch.randn(64, generator=gen) * 0.02}
    out = []
    for step in range(4):
        weights = {
            "layer.w": master["w"].bfloat16(),
            "layer.b": master["b"].bfloat16(),
            "norm.h": (1 + master["b"]).half(),
            "scale.f": master["b"][:5].clone(),
            "steps.i": torch.tensor([step, 7, -1], dtype=torch.int32),
        }
        out.append(weights)
        master = {k: v - 1e-4 * torch.randn(v.shape, generator=gen) for k, v in master.items()}
    out[2]["layer.w"] = mutate(out[2]["layer.w"], 0.01, rng, "random")  # arbitrary bits as well
    return out


@dataclass
class Case:
    """A target blob and how to feed it: `run` applies it to `weights` (or returns decoded weights)."""

    kind: str
    blob: bytes
    start: StateDict  # the weights it is applied to
    expected: StateDict  # what a successful application must produce
    run: Callable[[StateDict, bytes], StateDict | None]


def _cases(versions: list[StateDict]) -> list[Case]:
    v0, v1, _, v3 = versions
    patches = [
        encode_patch(a, b, base_version=i, new_version=i + 1) for i, (a, b) in enumerate(itertools.pairwise(versions))
    ]
    merged = merge_patches(patches)

    def apply(weights: StateDict, blob: bytes) -> None:
        apply_patch(weights, blob)

    def merge_then_apply(weights: StateDict, blob: bytes) -> None:
        apply_patch(weights, merge_patches([blob, patches[1], patches[2]]))

    def recode_then_apply(weights: StateDict, blob: bytes) -> None:
        apply_patch(weights, recode_patch(merge_patches([patches[0], blob]), versions[2]))

    return [
        Case("patch-v1", patches[0], v0, v1, apply),
        Case("patch-v2", encode_patch(v0, v1, base_version=0, new_version=1, context=True), v0, v1, apply),
        Case("merged-v1", merged, v0, v3, apply),
        Case("merged-v2", recode_patch(merged, v3), v0, v3, apply),
        Case("merge-input", patches[0], v0, v3, merge_then_apply),
        Case("recode-input", patches[1], v0, versions[2], recode_then_apply),
        Case("snapshot-apply", encode_snapshot(v1, version=1), v0, v1, lambda w, b: apply_snapshot(w, b)),
        Case("snapshot-load", encode_snapshot(v3, version=3), {}, v3, lambda w, b: load_snapshot(b)),
    ]


# --- mutations
def _header_values(rng: np.random.Generator) -> object:
    choices = [
        lambda: int(rng.integers(-(2**40), 2**40)),
        lambda: -1,
        lambda: 2**64 + 3,
        lambda: 10**4000,  # a 4001-digit integer (longer ones: _mutate_raw_json)
        lambda: float(rng.normal()),
        lambda: float("nan"),
        lambda: True,
        lambda: None,
        lambda: "x" * int(rng.integers(0, 40)),
        list,
        lambda: [int(rng.integers(0, 9))] * int(rng.integers(1, 5)),
        dict,
        lambda: {"k": 1},
        lambda: _deep(int(rng.integers(50, 400))),  # deeper nesting: _mutate_raw_json
    ]
    return choices[int(rng.integers(len(choices)))]()


def _deep(depth: int) -> object:
    out: object = 0
    for _ in range(depth):
        out = [out]
    return out


def _leaves(obj: object, path: tuple = ()) -> list[tuple]:
    """Paths to every container slot (dict key or list index) in a JSON value."""
    out = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            out.append((*path, key))
            out.extend(_leaves(value, (*path, key)))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            out.append((*path, i))
            out.extend(_leaves(value, (*path, i)))
    return out


def _mutate_header(blob: bytes, rng: np.random.Generator) -> bytes:
    parsed = unpack(blob)
    header = copy.deepcopy(parsed.header)
    slots = _leaves(header)
    for _ in range(int(rng.integers(1, 3))):
        path = slots[int(rng.integers(len(slots)))]
        parent = header
        for key in path[:-1]:
            parent = parent[key]
        op = rng.random()
        if op < 0.1 and isinstance(parent, dict):
            del parent[path[-1]]
            slots = _leaves(header)
        elif op < 0.15 and isinstance(parent, dict):
            parent["extra"] = _header_values(rng)
        elif op < 0.55 and isinstance(parent[path[-1]], int) and not isinstance(parent[path[-1]], bool):
            parent[path[-1]] += int(rng.choice([-2, -1, 1, 2, 128, -128, 1 << 20]))  # near-miss numbers
        else:
            parent[path[-1]] = _header_values(rng)
            slots = _leaves(header)
        if not slots:
            break
    return pack(header, [bytes(parsed.payload)], parsed.version)


def _raw_header(blob: bytes, header_json: bytes, version: int) -> bytes:
    """A correctly framed, correctly checksummed blob around arbitrary header bytes."""
    import xxhash

    payload = bytes(unpack(blob).payload)
    header = zstd.ZstdCompressor(level=3).compress(header_json)
    digest = xxhash.xxh3_128(header + payload).digest()
    return PREFIX.pack(MAGIC, version, len(header), len(payload), digest) + header + payload


def _mutate_raw_json(blob: bytes, rng: np.random.Generator) -> bytes:
    version = unpack(blob).version
    texts = [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"kind": "patch", "tensors": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        b'{"kind": "patch", "base_hash": ' + b"9" * 6000 + b"}",
        b"\xff\xfe not utf-8",
        b'{"kind": "patch"',
        b"null",
        b'"patch"',
        json.dumps(unpack(blob).header).encode().replace(b'"', b"'", 1),
    ]
    return _raw_header(blob, texts[int(rng.integers(len(texts)))], version)


def _mutate_stream(blob: bytes, rng: np.random.Generator) -> bytes:
    """Corrupt bytes inside one decompressed frame, recompress, fix the sizes in the header, re-sign."""
    parsed = unpack(blob)
    header = copy.deepcopy(parsed.header)
    slices = [e for e in header.get("segments") or header["tensors"] if e.get("nbytes")]
    if not slices:
        return blob
    entry = slices[int(rng.integers(len(slices)))]
    payload = bytes(parsed.payload)
    frame = payload[entry["offset"] : entry["offset"] + entry["nbytes"]]
    raw = bytearray(zstd.ZstdDecompressor().decompress(frame))
    for _ in range(int(rng.integers(1, 4))):
        if raw:
            raw[int(rng.integers(len(raw)))] ^= int(rng.integers(1, 256))
    new_frame = zstd.ZstdCompressor(level=1).compress(bytes(raw))
    delta = len(new_frame) - entry["nbytes"]
    for other in header.get("segments") or header["tensors"]:
        if other["offset"] > entry["offset"]:
            other["offset"] += delta
    old_offset, old_nbytes = entry["offset"], entry["nbytes"]
    entry["nbytes"] = len(new_frame)
    payload = payload[:old_offset] + new_frame + payload[old_offset + old_nbytes :]
    return pack(header, [payload], parsed.version)


def mutate_blob(blob: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    """One random mutation of a valid blob: (what was done, the result)."""
    op = int(rng.integers(7))
    if op == 0:
        return "truncate", blob[: int(rng.integers(0, len(blob)))]
    if op == 1:
        return "extend", blob + bytes(rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8))
    if op == 2:
        damaged = bytearray(blob)
        for _ in range(int(rng.integers(1, 5))):
            damaged[int(rng.integers(len(damaged)))] ^= int(rng.integers(1, 256))
        return "flip", bytes(damaged)
    if op in (3, 4):
        return "header", _mutate_header(blob, rng)
    if op == 5:
        return "raw-json", _mutate_raw_json(blob, rng)
    return "stream", _mutate_stream(blob, rng)


# --- the fuzzer
def run_fuzz(cases_per_target: int, seed: int = 0) -> collections.Counter:
    """Mutate every target blob `cases_per_target` times (plus receiver updates); tally the outcomes."""
    rng = np.random.default_rng(seed)
    versions = _versions(seed)
    tally: collections.Counter = collections.Counter()
    for case in _cases(versions):
        for _ in range(cases_per_target):
            what, blob = mutate_blob(case.blob, rng)
            weights = clone(case.start)
            try:
                result = case.run(weights, blob)
            except PatchError:
                tally["refused"] += 1
                if not bits_equal(weights, case.start):
                    tally["BAD changed after refusal"] += 1
                continue
            except Exception as err:  # the fuzzer's job: any other type is a finding
                tally[f"BAD unexpected {type(err).__name__} ({case.kind}, {what})"] += 1
                continue
            got = result if result is not None else weights
            tally["accepted"] += 1
            if not bits_equal(got, case.expected):
                tally[f"BAD silently wrong ({case.kind}, {what})"] += 1
    _fuzz_receiver(versions, cases_per_target, rng, tally)
    tally["cases"] = sum(v for k, v in tally.items() if k in ("refused", "accepted") or k.startswith("BAD"))
    return tally


def _fuzz_receiver(versions: list[StateDict], n: int, rng: np.random.Generator, tally: collections.Counter) -> None:
    """WeightReceiver at version 0 gets updates to version 1 or 3 whose blobs or promises were tampered with."""
    v0, v1, _, v3 = versions
    hashes = [state_hash(v) for v in versions]
    patch = encode_patch(v0, v1, base_version=0, new_version=1, context=True)
    snapshot, tail = (
        encode_snapshot(versions[2], version=2),
        encode_patch(versions[2], v3, base_version=2, new_version=3),
    )
    templates = [
        (Update(1, hashes[1], 0, patch=patch), v1),
        (Update(3, hashes[3], 2, snapshot=snapshot, patch=tail), v3),
        (Update(2, hashes[2], 2, snapshot=snapshot), versions[2]),
    ]
    for i in range(n):
        update, expected = templates[i % len(templates)]
        receiver = WeightReceiver(clone(v0), version=0)
        fields = {
            "version": update.version,
            "state_hash": update.state_hash,
            "snapshot": update.snapshot,
            "patch": update.patch,
        }
        op = rng.random()
        if op < 0.15:  # tampered promise
            fields["version" if rng.random() < 0.5 else "state_hash"] = (
                int(rng.integers(0, 5)) if rng.random() < 0.5 else hashes[int(rng.integers(4))]
            )
        else:
            key = (
                "patch"
                if fields["patch"] is not None and (fields["snapshot"] is None or rng.random() < 0.5)
                else "snapshot"
            )
            fields[key] = mutate_blob(fields[key], rng)[1]
        tampered = Update(
            fields["version"], fields["state_hash"], update.base_version, fields["snapshot"], fields["patch"]
        )
        try:
            ok = receiver.apply(tampered)
        except Exception as err:
            tally[f"BAD unexpected {type(err).__name__} (receiver)"] += 1
            continue
        if not ok:
            tally["refused"] += 1
            if not bits_equal(receiver.weights, v0) or receiver.refused != 1 or receiver.held() != (None, None):
                tally["BAD changed after refusal (receiver)"] += 1
        else:
            tally["accepted"] += 1
            if not bits_equal(receiver.weights, expected) or receiver.state_hash != state_hash(expected):
                tally["BAD silently wrong (receiver)"] += 1


def _assert_clean(tally: collections.Counter) -> None:
    bad = {k: v for k, v in tally.items() if k.startswith("BAD")}
    assert not bad, f"fuzzing found {bad} (tally {dict(tally)})"


def test_fuzz_quick():
    tally = run_fuzz(60, seed=1)
    _assert_clean(tally)
    assert tally["refused"] > 0.8 * tally["cases"]


@pytest.mark.slow
def test_fuzz_10k():
    tally = run_fuzz(1200, seed=2)  # 8 targets x 1200 + 1200 receiver updates = 10,800 cases
    print("fuzz tally:", dict(sorted(tally.items())))
    _assert_clean(tally)
    assert tally["cases"] >= 10_000
