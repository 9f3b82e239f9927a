"""Full snapshots: every tensor's raw bits in the same checksummed container as patches (kind "snapshot").

Each tensor is cut into chunks of CHUNK elements and each chunk into byte planes (for bf16: the
exponent-bit+mantissa byte, then the sign+exponent byte), each plane chunk its own zstd block, so one Huffman
table fits one plane's statistics: the sign/exponent plane of trained weights holds few distinct values and
compresses to ~0.37 byte, the mantissa plane is near-random and zstd stores it raw at little cost. A 1-byte
plane chunk is 128 KiB, zstd's largest block; working chunk by chunk keeps the planes in cache and avoids
tensor-sized temporaries. Payload of one tensor: one zstd frame of [chunk 0: plane 0, plane 1, ...][chunk 1...].
"""

from __future__ import annotations

import numpy as np
import torch
import zstandard as zstd

from heterorl.weights import hashing
from heterorl.weights.format import (
    FORMAT_VERSION,
    PatchError,
    StateDict,
    TensorMeta,
    bits_view,
    check_matches,
    get_hash,
    get_opt_int,
    pack,
    parallel_map,
    read_bits_view,
    tensor_entries,
    tensor_header,
    unpack,
    writable_bits_view,
)
from heterorl.weights.intcode import compressor, decompress_exact

CHUNK = 1 << 17  # elements per plane chunk


def _compress_planes(bits_U: np.ndarray, level: int) -> list[bytes]:
    """One zstd frame (as pieces, joined once into the blob) of chunk-major byte planes, least significant
    plane first, a block per plane chunk."""
    if bits_U.size == 0:
        return []
    cobj = compressor(level).compressobj(size=bits_U.nbytes)
    out = []
    for start in range(0, bits_U.size, CHUNK):
        chunk = bits_U[start : start + CHUNK]
        for j in range(bits_U.dtype.itemsize):
            out.append(cobj.compress((chunk >> (8 * j)).astype(np.uint8)))  # astype keeps the low byte
            out.append(cobj.flush(zstd.COMPRESSOBJ_FLUSH_BLOCK))
    out.append(cobj.flush())
    return out


def _join_planes(raw_U: np.ndarray, bits_U: np.ndarray) -> None:
    """Inverse of the plane split: write the elements of `raw_U` (chunk-major planes) into `bits_U`."""
    itemsize = bits_U.dtype.itemsize
    for start in range(0, bits_U.size, CHUNK):
        n = min(CHUNK, bits_U.size - start)
        planes_PN = raw_U[start * itemsize : (start + n) * itemsize].reshape(itemsize, n)  # P planes x N elements
        out_N = bits_U[start : start + n]
        out_N[...] = planes_PN[0]
        for j in range(1, itemsize):
            plane_N = planes_PN[j].astype(bits_U.dtype)
            plane_N <<= 8 * j
            out_N |= plane_N


def encode_snapshot(
    weights: StateDict,
    *,
    level: int = 1,
    state_hash: str | None = None,
    version: int | None = None,
    workers: int = 1,
) -> bytes:
    """Encode all of `weights` (CPU tensors) as a snapshot; `state_hash` skips hashing when already known."""
    names = sorted(weights)

    def encode_one(name: str) -> tuple[list[bytes], bytes | None]:
        bits_U = read_bits_view(weights[name])
        digest = None if state_hash else hashing.bits_digest(bits_U)
        return _compress_planes(bits_U, level), digest

    encoded = parallel_map(encode_one, names, workers)
    if state_hash is None:
        state_hash = hashing.combine(
            [(n, weights[n].dtype, tuple(weights[n].shape), d) for n, (_, d) in zip(names, encoded, strict=True)]
        )
    entries, frames, offset = [], [], 0
    for name, (pieces, _) in zip(names, encoded, strict=True):
        t = weights[name]
        nbytes = sum(len(p) for p in pieces)
        entries.append(tensor_header(name, t.dtype, tuple(t.shape), offset, nbytes, t.numel() * t.element_size()))
        frames.extend(pieces)
        offset += nbytes
    header = {"kind": "snapshot", "result_hash": state_hash, "result_version": version, "tensors": entries}
    return pack(header, frames)


def _parse(snapshot: bytes | bytearray | memoryview) -> tuple[list[TensorMeta], str, memoryview]:
    blob = unpack(snapshot)
    header = blob.header
    if header.get("kind") != "snapshot" or blob.version != FORMAT_VERSION:
        raise PatchError(f"expected a snapshot, got kind {header.get('kind')!r} (format version {blob.version})")
    metas = [meta for meta, _ in tensor_entries(header, len(blob.payload))]
    for meta in metas:
        if meta.raw_nbytes != meta.numel * meta.itemsize:
            raise PatchError(f"tensor {meta.name!r}: raw_nbytes {meta.raw_nbytes} does not match its shape")
    get_opt_int(header, "result_version")
    return metas, get_hash(header, "result_hash"), blob.payload


def _decode(metas: list[TensorMeta], result_hash: str, payload: memoryview, workers: int) -> dict[str, torch.Tensor]:
    def decode_one(meta: TensorMeta) -> tuple[torch.Tensor, bytes]:
        raw_U = decompress_exact(payload[meta.offset : meta.offset + meta.nbytes], meta.raw_nbytes, meta.name)
        t = torch.empty(meta.shape, dtype=meta.dtype)
        bits_U = bits_view(t)
        _join_planes(raw_U, bits_U)
        return t, hashing.bits_digest(bits_U)

    decoded = parallel_map(decode_one, metas, workers)
    got = hashing.combine([(*m.layout, d) for m, (_, d) in zip(metas, decoded, strict=True)])
    if got != result_hash:
        raise PatchError(f"snapshot decodes to hash {got}, its header promises {result_hash}")
    return {m.name: t for m, (t, _) in zip(metas, decoded, strict=True)}


def load_snapshot(snapshot: bytes | bytearray | memoryview, *, workers: int = 1) -> dict[str, torch.Tensor]:
    """Decode a snapshot into new CPU tensors (sorted by name); PatchError if anything is off, hash included."""
    return _decode(*_parse(snapshot), workers)


def apply_snapshot(weights: StateDict, snapshot: bytes | bytearray | memoryview, *, workers: int = 1) -> None:
    """Overwrite `weights` in place with a snapshot of the same layout; on any error nothing is written.

    The layout is checked before decoding, so a snapshot for another model costs no decode; decoding goes to
    fresh tensors (one transient model copy) that are hash-checked before the copy into `weights`.
    """
    metas, result_hash, payload = _parse(snapshot)
    check_matches(weights, metas)
    views = {m.name: writable_bits_view(weights[m.name], m.name) for m in metas}
    for name, t in _decode(metas, result_hash, payload, workers).items():
        views[name][...] = bits_view(t)
