"""The framing every heterorl wire message uses: magic | u32 header length | JSON header | body.

Explicit and self-describing (never pickle); `unframe` checks the magic, that the header fits the message, and
that it is a JSON object, raising the caller's error type with a message that says what is wrong. The body's
layout is the caller's (rollout arrays, weight snapshot + patch).
"""

from __future__ import annotations

import json
import struct
from typing import Any


def _header_bytes(header: dict[str, Any]) -> bytes:
    return json.dumps(header, separators=(",", ":"), sort_keys=True).encode()


def frame(magic: bytes, header: dict[str, Any], body: bytes = b"") -> bytes:
    """`magic | u32 len(header) | header JSON | body`, little-endian."""
    head = _header_bytes(header)
    return struct.pack(f"<{len(magic)}sI", magic, len(head)) + head + body


def frame_nbytes(magic: bytes, header: dict[str, Any]) -> int:
    """Bytes of the frame's prefix and header (add the body's length for the whole message)."""
    return len(magic) + 4 + len(_header_bytes(header))


def unframe(data: bytes, magic: bytes, max_header: int, error: type[ValueError]) -> tuple[dict[str, Any], int]:
    """The header of a framed message and the offset where its body starts."""
    prefix = struct.Struct(f"<{len(magic)}sI")
    if len(data) < prefix.size:
        raise error(f"message of {len(data)} bytes is shorter than its {prefix.size}-byte prefix")
    found, head_len = prefix.unpack_from(data)
    if found != magic:
        raise error(f"bad magic {found!r}, expected {magic!r}")
    if head_len > max_header or prefix.size + head_len > len(data):
        raise error(f"header length {head_len} does not fit a message of {len(data)} bytes")
    try:
        header = json.loads(data[prefix.size : prefix.size + head_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"header is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise error("header must be a JSON object")
    return header, prefix.size + head_len


def non_negative_int(header: dict[str, Any], key: str, error: type[ValueError]) -> int:
    """A header field that must be an integer >= 0 (booleans are not integers here)."""
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise error(f"header field {key!r} must be a non-negative integer, got {value!r}")
    return value
