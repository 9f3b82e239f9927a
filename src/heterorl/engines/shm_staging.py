"""Weight updates through shared memory: the engine writes published tensors into a file that vLLM's worker maps once.

A vLLM engine runs its model in another process (the worker), so an update must cross a process boundary.
Serializing it (safetensors bytes through vLLM's RPC) costs a copy into the message, the message's own copies and a
parse on the other side. Here the bytes travel once: the engine (`StagingBuffer.stage`) copies each tensor into a
file in shared memory (/dev/shm) and sends only a manifest through the RPC — name, dtype, shape, offset and the
xxh3-64 digest of the tensor's bytes per entry, a few kB. The worker (`MappedBuffer`) maps the file once, reads
each tensor in place, checks the manifest against the model and the mapped size, and recomputes the digests
before it touches a parameter: an update whose bytes were corrupted in the buffer (or misread) is refused and the
model keeps its weights. xxh3 runs at memory speed (several GB/s per core), so the check costs a fraction of the
copy it protects.

Nothing here is unpickled or trusted: the manifest is plain lists of str / int, validated entry by entry.
The buffer grows (a new file) when an update does not fit; its name is unlinked once the worker has mapped it,
so nothing is left in /dev/shm if a process dies.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash

ALIGN = 64  # every tensor starts on a cache line (and on its element size)
CHUNK = 1 << 18  # bytes copied, hashed and checked while in cache (a multiple of every element size)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_FINITE_BITS = {"bfloat16": (np.int16, 0x7F80), "float16": (np.int16, 0x7C00), "float32": (np.int32, 0x7F800000)}
SHM_DIR = Path("/dev/shm")


@dataclass(frozen=True)
class Entry:
    """Where one tensor lies in the buffer and the digest of its bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    digest: str  # xxh3-64 of the tensor's bytes, hex

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * DTYPES[self.dtype].itemsize

    def to_wire(self) -> list:
        """Plain lists and scalars (what vLLM's RPC carries without pickling)."""
        return [self.name, self.dtype, list(self.shape), self.offset, self.digest]

    @classmethod
    def from_wire(cls, item: object) -> Entry:
        """Parse one manifest item; ValueError naming what is wrong."""
        if not isinstance(item, list | tuple) or len(item) != 5:
            raise ValueError(f"a manifest entry is not [name, dtype, shape, offset, digest]: {item!r:.200}")
        name, dtype, shape, offset, digest = item
        if not isinstance(name, str) or dtype not in DTYPES or not isinstance(digest, str):
            raise ValueError(f"manifest entry {name!r:.100}: bad name, dtype {dtype!r:.20} or digest")
        if not isinstance(shape, list | tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"manifest entry {name}: bad shape {shape!r:.100}")
        if not isinstance(offset, int) or offset < 0 or offset % ALIGN:
            raise ValueError(f"manifest entry {name}: bad offset {offset!r:.30}")
        return cls(name, dtype, tuple(shape), offset, digest)


class NonFiniteError(ValueError):
    """An update holds NaN or infinity."""


def digest(tensor: torch.Tensor) -> str:
    """xxh3-64 of a contiguous CPU tensor's bytes (hex)."""
    return xxhash.xxh3_64_hexdigest(tensor.reshape(-1).view(torch.uint8).numpy())


def copy_digest_finite(src_u8: np.ndarray, dst_u8: np.ndarray, dtype: str) -> tuple[str, bool]:
    """Copy `src_u8` into `dst_u8` and return (xxh3-64 of the bytes, all values finite), in one pass over memory.

    Chunk by chunk (`CHUNK` bytes, in cache): copy, hash the copy, and test finiteness on the bits: a float is
    NaN or infinite iff its exponent bits are all ones, i.e. (bits & ~sign) >= the exponent mask.
    """
    int_type, exponent = _FINITE_BITS[dtype]
    magnitude = np.iinfo(int_type).max  # every bit but the sign
    hasher = xxhash.xxh3_64()
    scratch = np.empty(CHUNK // np.dtype(int_type).itemsize, dtype=int_type)
    largest = 0
    for start in range(0, src_u8.size, CHUNK):
        out = dst_u8[start : start + CHUNK]
        np.copyto(out, src_u8[start : start + CHUNK])
        hasher.update(out)
        bits = out.view(int_type)
        masked = scratch[: bits.size]
        np.bitwise_and(bits, magnitude, out=masked)
        largest = max(largest, int(masked.max(initial=0)))
    return hasher.hexdigest(), largest < exponent


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def shared_dir(nbytes: int) -> Path:
    """/dev/shm when it has room for `nbytes` (containers often give it 64 MB), else the temp directory (a page-cached
    file: still one copy, no serialization)."""
    if SHM_DIR.is_dir() and os.access(SHM_DIR, os.W_OK):
        stat = os.statvfs(SHM_DIR)
        if stat.f_bavail * stat.f_frsize > 2 * nbytes:
            return SHM_DIR
    return Path(tempfile.gettempdir())


class StagingBuffer:
    """The engine's side: a shared file the published tensors are copied into, one update at a time."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.size = 0
        self.mapped = False  # the worker has mapped the current file (its name is then unlinked)
        self._fd: int | None = None
        self._map: mmap.mmap | None = None
        self.bytes: torch.Tensor = torch.empty(0, dtype=torch.uint8)  # the whole buffer, writable

    def stage(self, tensors: Mapping[str, torch.Tensor]) -> list[Entry]:
        """Copy `tensors` (floating point) into the buffer; their manifest. Grows the buffer if needed.

        Raises ValueError for a dtype that cannot be staged, and `NonFiniteError` naming every tensor that holds
        a NaN or an infinity (nothing should load such an update; the bytes staged so far are simply unused).
        """
        layout, offset = [], 0
        for name, tensor in tensors.items():
            dtype = str(tensor.dtype).removeprefix("torch.")
            if dtype not in DTYPES:
                raise ValueError(f"{name}: dtype {tensor.dtype} cannot be staged (bfloat16, float16, float32)")
            layout.append((name, tensor, dtype, offset))
            offset = _aligned(offset + tensor.numel() * tensor.element_size())
        if offset > self.size or self.path is None:
            self._grow(offset)
        entries, non_finite = [], []
        buffer = self.bytes.numpy()
        for name, tensor, dtype, start in layout:
            src = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
            hex_digest, finite = copy_digest_finite(src, buffer[start : start + src.size], dtype)
            entries.append(Entry(name, dtype, tuple(tensor.shape), start, hex_digest))
            if not finite:
                non_finite.append(name)
        if non_finite:
            raise NonFiniteError(f"{len(non_finite)} tensors hold NaN or infinity, e.g. {non_finite[:3]}")
        return entries

    def _grow(self, nbytes: int) -> None:
        """A new, larger file (the worker maps it on the next update; the old mapping is dropped)."""
        self.close()
        size = max(nbytes, 1 << 20)
        fd, path = tempfile.mkstemp(prefix="heterorl-weights-", dir=shared_dir(size))
        try:
            os.posix_fallocate(fd, 0, size)  # reserve the pages now: a full tmpfs fails here, not with SIGBUS later
            self._map = mmap.mmap(fd, size)
        except OSError:
            os.close(fd)
            os.unlink(path)
            raise
        self._fd, self.path, self.size, self.mapped = fd, path, size, False
        self.bytes = torch.frombuffer(self._map, dtype=torch.uint8)

    def worker_mapped(self) -> None:
        """The worker holds the mapping: unlink the name (the memory lives until both sides unmap)."""
        if self.path is not None and not self.mapped:
            Path(self.path).unlink(missing_ok=True)
            self.mapped = True

    def close(self) -> None:
        """Drop the mapping and the file (idempotent)."""
        self.bytes = torch.empty(0, dtype=torch.uint8)
        self._map = None  # unmapped when the last tensor viewing it is gone
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.path is not None and not self.mapped:
            Path(self.path).unlink(missing_ok=True)
        self.path, self.size = None, 0


class MappedBuffer:
    """The worker's side: the engine's staging file mapped read-only, once per file."""

    def __init__(self) -> None:
        self.path: str | None = None
        self.size = 0
        self._map: mmap.mmap | None = None
        self._bytes: torch.Tensor = torch.empty(0, dtype=torch.uint8)

    def attach(self, path: object, size: object) -> None:
        """Map `path` (unless it is the file mapped already); its size must be `size`."""
        if not isinstance(path, str) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"bad staging buffer {path!r:.200} of {size!r:.30} bytes")
        if path == self.path and size == self.size:
            return
        with open(path, "rb") as f:
            actual = os.fstat(f.fileno()).st_size
            if actual != size:
                raise ValueError(f"staging buffer {path} has {actual} bytes, expected {size}")
            new_map = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
        self.close()
        self._map, self.path, self.size = new_map, path, size
        with warnings.catch_warnings():  # read-only memory: torch warns that writing would fail; nothing writes
            warnings.simplefilter("ignore", UserWarning)
            self._bytes = torch.frombuffer(new_map, dtype=torch.uint8)

    def tensors(self, manifest: object) -> dict[str, tuple[Entry, torch.Tensor]]:
        """Name -> (entry, tensor viewing the mapped bytes) for a manifest; ValueError on any bad entry (unknown
        dtype, out of bounds, overlapping, duplicated)."""
        if self._map is None:
            raise ValueError("no staging buffer is mapped")
        if not isinstance(manifest, list | tuple):
            raise ValueError(f"the manifest is a {type(manifest).__name__}, not a list")
        entries = sorted((Entry.from_wire(item) for item in manifest), key=lambda e: e.offset)
        out: dict[str, tuple[Entry, torch.Tensor]] = {}
        end = 0
        for e in entries:
            if e.name in out:
                raise ValueError(f"{e.name} appears twice in the manifest")
            if e.offset < end or e.offset + e.nbytes > self.size:
                raise ValueError(f"{e.name}: bytes [{e.offset}, {e.offset + e.nbytes}) overlap or leave the buffer")
            end = e.offset + e.nbytes
            view = self._bytes[e.offset : end].view(DTYPES[e.dtype]).view(e.shape)
            out[e.name] = (e, view)
        return out

    def close(self) -> None:
        """Drop the mapping (unmapped when the last tensor viewing it is gone)."""
        self._bytes = torch.empty(0, dtype=torch.uint8)
        self._map = None
        self.path, self.size = None, 0


def corrupted(tensors: Mapping[str, tuple[Entry, torch.Tensor]]) -> list[str]:
    """Names whose mapped bytes do not hash to their manifest digest."""
    return [name for name, (entry, view) in tensors.items() if digest(view) != entry.digest]


def update_problems(report: dict[str, Any]) -> list[str]:
    """What the worker's `heterorl_apply_update`'s report says went wrong (nothing: the update landed)."""
    problems = []
    if report["mismatched"]:
        problems.append(f"{len(report['mismatched'])} tensors not held as sent, e.g. {report['mismatched'][:3]}")
    if report["stale"]:
        problems.append(
            f"{len(report['stale'])} layers compute with other weights than they hold (a packed kernel copy), "
            f"e.g. {report['stale'][:3]}"
        )
    if report["probed"] == 0:
        problems.append("no linear layer could be probed")
    return problems
