"""The shared framing's JSON header parser is bounded: whatever a peer puts in a header (deep nesting, huge
integers, NaN literals, bytes that are not UTF-8), the caller gets its own error type and nothing else."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heterorl.framing import MAX_JSON_DEPTH, json_depth, loads_bounded, unframe
from heterorl.rollout_codec import MAGIC as ROLLOUT_MAGIC
from heterorl.rollout_codec import GroupLimits, RolloutError, decode_group
from heterorl.weights.envelope import MAGIC as ENVELOPE_MAGIC
from heterorl.weights.envelope import EnvelopeError, decode_update


class HeaderError(ValueError):
    pass


def framed(magic: bytes, head: bytes, body: bytes = b"") -> bytes:
    return struct.pack(f"<{len(magic)}sI", magic, len(head)) + head + body


HOSTILE_HEADERS = [
    b'{"version": ' + b"9" * 5000 + b"}",  # Python refuses > 4300 digits with a ValueError
    b'{"version": -' + b"1" * 30 + b"}",
    b"[" * 20_000 + b"]" * 20_000,  # RecursionError in the stdlib parser
    b'{"a": ' + b"[" * 20_000 + b"]" * 20_000 + b"}",
    b'{"a": "\\n", "b": ' + b"{" * 5000 + b"}" * 5000 + b"}",  # an escape must not hide what follows
    b'{"version": NaN}',
    b'{"version": Infinity}',
    b'{"version": 1}\xff\xfe',
    b"\xc3\x28",
]


@pytest.mark.parametrize("head", HOSTILE_HEADERS)
def test_hostile_headers_raise_the_callers_error_only(head: bytes) -> None:
    with pytest.raises(HeaderError):
        unframe(framed(b"MAGC", head), b"MAGC", 1 << 20, HeaderError)
    with pytest.raises(RolloutError) as err:
        decode_group(framed(ROLLOUT_MAGIC, head), GroupLimits(vocab_size=46, current_version=3))
    assert err.value.reason == "malformed"
    with pytest.raises(EnvelopeError):
        decode_update(framed(ENVELOPE_MAGIC, head[:4000]))  # the envelope's header is at most 4 KiB


def test_header_integers_are_bounded() -> None:
    head = json.dumps({"version": 2**63, "state_hash": "ab", "base_version": None, "kind": "patch"}).encode()
    with pytest.raises(EnvelopeError, match="version"):
        decode_update(framed(ENVELOPE_MAGIC, head))


def test_shallow_headers_with_brackets_in_strings_parse() -> None:
    header = {"prompt": '[[[[[[[[[[[[ {{{{{{{{{{ \\ " ', "info": {"a": 1}}
    assert loads_bounded(json.dumps(header).encode(), HeaderError) == header


_text = st.text(alphabet='[]{}"\\ab\n', max_size=6)
_json = st.recursive(
    st.none() | st.integers(-(10**6), 10**6) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=30,
)


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(_json)
def test_json_depth_is_the_true_nesting_depth(value: object) -> None:
    raw = json.dumps(value).encode()
    assert json_depth(raw) == _depth(value)
    if _depth(value) <= MAX_JSON_DEPTH:
        assert loads_bounded(raw, HeaderError) == value
    else:
        with pytest.raises(HeaderError):
            loads_bounded(raw, HeaderError)
