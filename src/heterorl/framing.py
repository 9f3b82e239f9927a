"""The framing every heterorl wire message uses: magic | u32 header length | JSON header | body.

Explicit and self-describing (never pickle); `unframe` checks the magic, that the header fits the message, and
that it is a JSON object, raising the caller's error type with a message that says what is wrong. The body's
layout is the caller's (rollout arrays, weight snapshot + patch).

Headers come from peers that may be buggy or hostile, so the JSON parser is bounded (`loads_bounded`): nesting
deeper than `MAX_JSON_DEPTH` (Python's parser recurses and raises RecursionError at ~1000), integers longer than
`MAX_INT_DIGITS` digits (Python refuses > 4300 with a ValueError, and big ones cost quadratic time) and the
non-standard NaN / Infinity literals are all the caller's error type, never another exception.
"""

from __future__ import annotations

import json
import re
import struct
from typing import Any

MAX_JSON_DEPTH = 8  # our headers nest at most 2 deep (the rollout header's `info` object)
MAX_INT_DIGITS = 20  # every integer a header carries fits in 64 bits
MAX_HEADER_INT = 2**62  # ... and is a count, size or version far below this


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
    header = loads_bounded(bytes(data[prefix.size : prefix.size + head_len]), error)
    if not isinstance(header, dict):
        raise error("header must be a JSON object")
    return header, prefix.size + head_len


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_BRACKETS = re.compile(rb'[\[\]{}"\\]')


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string, escaped_at = False, -1
    for match in _BRACKETS.finditer(raw):
        at, char = match.start(), match.group()
        if at == escaped_at:  # the byte after a backslash inside a string
            continue
        if in_string:
            if char == b"\\":
                escaped_at = at + 1
            elif char == b'"':
                in_string = False
        elif char == b'"':
            in_string = True
        elif char in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif char in (b"]", b"}"):
            depth -= 1
    return deepest


def loads_bounded(raw: bytes, error: type[ValueError], max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads` of UTF-8 `raw` that raises only `error`: bounded depth and integer size, no NaN/Infinity."""
    if raw.count(b"[") + raw.count(b"{") > max_depth and json_depth(raw) > max_depth:
        raise error(f"header is nested deeper than {max_depth} levels")
    try:
        return json.loads(raw.decode("utf-8"), parse_int=_parse_int, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, the hooks' errors
        raise error(f"header is not valid JSON: {str(exc)[:200]}") from None


def non_negative_int(header: dict[str, Any], key: str, error: type[ValueError]) -> int:
    """A header field that must be an integer >= 0 (booleans are not integers here)."""
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_HEADER_INT:
        raise error(f"header field {key!r} must be a non-negative integer, got {str(value)[:40]!r}")
    return value
