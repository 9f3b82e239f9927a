"""The byte container shared by patches and snapshots, dtype tables and raw-bit views.

Layout of every blob (little-endian)::

    offset  size  field
    0       8     magic            b"HRLWSYNC"
    8       4     format_version   u32: 1 (snapshots, plain patches) or 2 (context-coded patches, ctxpatch.py)
    12      4     header_len       u32, bytes of the (compressed) header
    16      8     payload_len      u64, bytes of the payload
    24      16    checksum         xxh3-128 digest of header bytes + payload bytes
    40      H     header           zstd frame of a UTF-8 JSON object (sorted keys, no whitespace)
    40+H    P     payload          per-tensor blobs at the offsets the header names

The total length must equal 40 + header_len + payload_len exactly, so every truncation or extension is caught
before anything is parsed; the checksum then catches every corruption of header or payload (and a corrupted
checksum field fails the comparison), so a damaged blob never reaches the decoders. JSON (never pickle) keeps
the header inspectable and safe to parse from an untrusted source; its fields are still type- and
range-checked because a valid checksum only proves the bytes are what *some* encoder wrote. The JSON is
zstd-compressed because its per-tensor entries repeat keys and name prefixes: uncompressed it was ~6% of a
1% patch of a 100M-parameter model (75 KB of 1.3 MB), compressed 0.5%.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch
import xxhash
import zstandard as zstd

MAGIC = b"HRLWSYNC"
FORMAT_VERSION = 1  # snapshots and plain patches (patch.py)
CTX_FORMAT_VERSION = 2  # patches coded by magnitude class (ctxpatch.py)
FORMAT_VERSIONS = (FORMAT_VERSION, CTX_FORMAT_VERSION)
PREFIX = struct.Struct("<8sIIQ16s")  # magic, format_version, header_len, payload_len, checksum
MAX_HEADER_BYTES = 64 << 20  # decompressed; a header names tensors, not data, so anything larger is garbage
HEADER_LEVEL = 3  # the header is small; a denser level costs nothing noticeable

StateDict = Mapping[str, torch.Tensor]
_T = TypeVar("_T")
_R = TypeVar("_R")


class PatchError(ValueError):
    """A patch or snapshot is malformed, corrupted, or does not fit the weights it is applied to."""


# Dtypes a blob may carry, by the name written in headers. Patches work on raw bits, so any fixed-width dtype
# works the same way; bf16/fp16/fp32 are what samplers load, the rest lets whole state dicts (buffers) travel.
DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "bool": torch.bool,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
ITEMSIZE: dict[torch.dtype, int] = {v: v.itemsize for v in DTYPES.values()}  # bytes per element (a dict lookup)
_UINT_VIEW = {1: torch.uint8, 2: torch.uint16, 4: torch.uint32, 8: torch.uint64}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def dtype_name(dtype: torch.dtype) -> str:
    """Header name of a supported dtype; ValueError for anything else (complex, float8, ...)."""
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} is not supported by weight sync (supported: {sorted(DTYPES)})") from None


def bits_view(t: torch.Tensor) -> np.ndarray:
    """Flat unsigned-integer numpy view of a tensor's raw bits (uint16 for bf16/fp16, uint32 for fp32, ...).

    Comparing these views is how "changed" is defined: float `!=` would call +0.0 == -0.0 and NaN != NaN.
    Zero-copy for contiguous CPU tensors, so writes through the view land in the tensor.
    """
    if t.device.type != "cpu":
        raise ValueError(f"weight sync works on CPU tensors, got device {t.device}")
    bits = t.view(_UINT_VIEW[t.element_size()])  # torch's unsigned views: one view, and .numpy() gives the dtype
    return bits.numpy().reshape(-1)


def read_bits_view(t: torch.Tensor) -> np.ndarray:
    """`bits_view` of a tensor to read, one that requires grad included (detached only then: detaching costs
    ~1 us a tensor, paid twice per tensor of every encode)."""
    return bits_view(t.detach() if t.requires_grad else t)


def writable_bits_view(t: torch.Tensor, name: str) -> np.ndarray:
    """`bits_view` that is guaranteed to alias the tensor's storage (needed to write in place)."""
    if not t.is_contiguous():
        raise PatchError(f"tensor {name!r} is not contiguous; cannot update it in place")
    return bits_view(t)


@dataclass(frozen=True)
class Blob:
    """A parsed, checksum-verified container: format version, the JSON header, a zero-copy view of the payload."""

    header: dict[str, Any]
    payload: memoryview
    version: int = FORMAT_VERSION


def pack(header: Mapping[str, Any], payload_parts: Sequence[bytes], version: int = FORMAT_VERSION) -> bytes:
    """Assemble header + payload pieces into one blob with lengths and checksum (one copy of each piece)."""
    assert version in FORMAT_VERSIONS, f"unknown format version {version}"
    header_json = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    header_bytes = zstd.ZstdCompressor(level=HEADER_LEVEL).compress(header_json)
    hasher = xxhash.xxh3_128(header_bytes)
    for part in payload_parts:
        hasher.update(part)
    payload_len = sum(len(part) for part in payload_parts)
    prefix = PREFIX.pack(MAGIC, version, len(header_bytes), payload_len, hasher.digest())
    return b"".join((prefix, header_bytes, *payload_parts))


def unpack(blob: bytes | bytearray | memoryview) -> Blob:
    """Check magic, version, lengths and checksum, then parse the header. Raises PatchError on any problem."""
    view = memoryview(blob).cast("B")
    if len(view) < PREFIX.size:
        raise PatchError(f"blob too short: {len(view)} bytes, the fixed prefix alone is {PREFIX.size}")
    magic, version, header_len, payload_len, checksum = PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise PatchError(f"bad magic {magic!r}: not a heterorl weight-sync blob")
    if version not in FORMAT_VERSIONS:
        raise PatchError(f"unsupported format version {version} (this build reads {FORMAT_VERSIONS})")
    expected = PREFIX.size + header_len + payload_len
    if len(view) != expected:
        raise PatchError(f"blob is {len(view)} bytes but its prefix declares {expected} (truncated or padded)")
    header_bytes = view[PREFIX.size : PREFIX.size + header_len]
    payload = view[PREFIX.size + header_len :]
    hasher = xxhash.xxh3_128(header_bytes)
    hasher.update(payload)
    if hasher.digest() != checksum:
        raise PatchError("checksum mismatch: the blob is corrupted")
    try:
        size = zstd.get_frame_parameters(header_bytes).content_size
        if not 0 < size <= MAX_HEADER_BYTES:
            raise PatchError(f"header frame declares {size} bytes (limit {MAX_HEADER_BYTES})")
        header = json.loads(zstd.ZstdDecompressor().decompress(header_bytes, max_output_size=size))
    except zstd.ZstdError as err:
        raise PatchError(f"header is not a valid zstd frame: {err}") from None
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError, int digit limit; nesting
        raise PatchError(f"header is not valid JSON: {type(err).__name__}: {str(err)[:200]}") from None
    if not isinstance(header, dict):
        raise PatchError("header is not a JSON object")
    return Blob(header=header, payload=payload, version=version)


# --- header field checks: a checksum proves integrity, not that the encoder was sane.
def get_int(obj: Mapping[str, Any], key: str, lo: int = 0, hi: int = 2**63 - 1) -> int:
    """obj[key] as an int in [lo, hi] (bools rejected), else PatchError naming the field."""
    value = obj.get(key)
    if type(value) is not int or not lo <= value <= hi:
        raise PatchError(f"header field {key!r} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def get_opt_int(obj: Mapping[str, Any], key: str) -> int | None:
    """obj[key] as a non-negative int or None."""
    return None if obj.get(key) is None else get_int(obj, key)


def get_str(obj: Mapping[str, Any], key: str) -> str:
    """obj[key] as a str, else PatchError."""
    value = obj.get(key)
    if not isinstance(value, str):
        raise PatchError(f"header field {key!r} must be a string, got {type(value).__name__}")
    return value


def get_hash(obj: Mapping[str, Any], key: str) -> str:
    """obj[key] as a 32-hex-digit xxh3-128 digest."""
    value = get_str(obj, key)
    if len(value) != 32 or any(c not in "0123456789abcdef" for c in value):
        raise PatchError(f"header field {key!r} is not a 32-digit lowercase hex digest: {value!r}")
    return value


@dataclass(frozen=True)
class TensorMeta:
    """Name, dtype and shape of one tensor as written in a header, plus its payload slice."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    raw_nbytes: int

    @property
    def layout(self) -> tuple[str, torch.dtype, tuple[int, ...]]:
        return self.name, self.dtype, self.shape

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]


def entry_layout(entry: Any, prev_name: str | None) -> tuple[str, torch.dtype, tuple[int, ...]]:
    """One entry of a `tensors` list (both patch formats): an object whose name sorts after `prev_name`, with a
    known dtype and a shape of at most 64 non-negative ints."""
    if not isinstance(entry, dict):
        raise PatchError("each entry of 'tensors' must be an object")
    name = get_str(entry, "name")
    if prev_name is not None and name <= prev_name:
        raise PatchError(f"tensor names must be unique and sorted; {name!r} follows {prev_name!r}")
    dname = get_str(entry, "dtype")
    if dname not in DTYPES:
        raise PatchError(f"tensor {name!r}: unknown dtype {dname!r}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or len(shape) > 64 or any(type(d) is not int or d < 0 for d in shape):
        raise PatchError(f"tensor {name!r}: shape must be a list of non-negative ints, got {shape!r}")
    return name, DTYPES[dname], tuple(shape)


def tensor_entries(header: Mapping[str, Any], payload_len: int) -> list[tuple[TensorMeta, Mapping[str, Any]]]:
    """Validate the `tensors` list: sorted unique names, known dtypes, shapes, contiguous in-bounds offsets."""
    entries = header.get("tensors")
    if not isinstance(entries, list):
        raise PatchError("header field 'tensors' must be a list")
    out: list[tuple[TensorMeta, Mapping[str, Any]]] = []
    cursor = 0
    prev_name: str | None = None
    for entry in entries:
        name, dtype, shape = entry_layout(entry, prev_name)
        prev_name = name
        offset = get_int(entry, "offset")
        nbytes = get_int(entry, "nbytes")
        if offset != cursor or offset + nbytes > payload_len:
            raise PatchError(f"tensor {name!r}: payload slice [{offset}, {offset + nbytes}) is misplaced")
        cursor = offset + nbytes
        meta = TensorMeta(name, dtype, shape, offset, nbytes, get_int(entry, "raw_nbytes"))
        if meta.numel > 2**62:
            raise PatchError(f"tensor {name!r}: shape {shape} is absurdly large")
        out.append((meta, entry))
    if cursor != payload_len:
        raise PatchError(f"tensor slices cover {cursor} bytes but the payload is {payload_len}")
    return out


def check_matches(weights: StateDict, metas: list[TensorMeta]) -> None:
    """The weights must hold exactly the blob's tensors with the same dtypes and shapes."""
    names = sorted(weights)
    expected = [m.name for m in metas]
    if names != expected:
        missing = sorted(set(expected) - set(names))[:5]
        extra = sorted(set(names) - set(expected))[:5]
        raise PatchError(f"tensor names differ from the blob's: missing {missing}, unexpected {extra}")
    for meta in metas:
        t = weights[meta.name]
        if t.dtype != meta.dtype or tuple(t.shape) != meta.shape:
            raise PatchError(
                f"tensor {meta.name!r} is {t.dtype} {tuple(t.shape)} but the blob has {meta.dtype} {meta.shape}"
            )


def tensor_header(
    name: str, dtype: torch.dtype, shape: tuple[int, ...], offset: int, nbytes: int, raw_nbytes: int
) -> dict[str, Any]:
    """The common per-tensor header fields."""
    return {
        "name": name,
        "dtype": dtype_name(dtype),
        "shape": list(shape),
        "offset": offset,
        "nbytes": nbytes,
        "raw_nbytes": raw_nbytes,
    }


def check_same_layout(base: StateDict, new: StateDict) -> None:
    """Two state dicts that a patch connects must agree on names, dtypes and shapes."""
    if sorted(base) != sorted(new):
        raise ValueError(f"base and new hold different tensors: {sorted(set(base) ^ set(new))[:5]}")
    for name, t in base.items():
        n = new[name]
        if t.dtype != n.dtype or t.shape != n.shape:
            raise ValueError(f"tensor {name!r}: base is {t.dtype} {tuple(t.shape)}, new is {n.dtype} {tuple(n.shape)}")


def parallel_map(fn: Callable[[_T], _R], items: Sequence[_T], workers: int) -> list[_R]:
    """[fn(x) for x in items], in `workers` threads when > 1 (numpy, xxhash and zstd release the GIL)."""
    if workers <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))
