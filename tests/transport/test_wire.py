"""The conversation's bytes (`transport.wire`): every upload and reply round-trips exactly, and a header field out of
its type or bound is refused with a WireError naming it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heterorl.framing import frame, unframe
from heterorl.loop.protocol import GroupVerdict, Reply, Upload
from heterorl.transport.wire import (
    REPLY_MAGIC,
    UPLOAD_MAGIC,
    WireError,
    decode_reply,
    decode_upload,
    encode_reply,
    encode_upload,
)

totals = st.integers(min_value=0, max_value=2**40)
seconds = st.floats(min_value=0.0, max_value=3600.0, allow_nan=False)
names = st.from_regex(r"[A-Za-z0-9_-]{1,16}", fullmatch=True)
groups = st.lists(st.binary(min_size=1, max_size=64), max_size=6)


@given(names, names, totals, st.integers(-1, 10**6), totals, totals, totals, st.none() | st.floats(0.0, 1.0), groups)
def test_an_upload_round_trips(sampler, session, seq, version, wanted, used, returned, idle, bodies) -> None:
    digests = tuple(f"{i:032x}" for i in range(len(bodies)))
    upload = Upload(
        sampler, session, seq, version, wanted, used, returned, idle, 3, tuple(bodies), digests, {"a.b": "0123abcd"}
    )
    assert decode_upload(encode_upload(upload)) == upload


@given(totals, st.lists(st.sampled_from(["accepted", "busy", "stale"]), max_size=5), totals, totals, seconds, seconds)
def test_a_reply_round_trips(seq, outcomes, granted, voided, retry_after, handled) -> None:
    verdicts = tuple(GroupVerdict(o, f"s:{i}@b", "why" if o == "stale" else "") for i, o in enumerate(outcomes))
    reply = Reply(seq, verdicts, granted, voided, 7, False, retry_after, "", "", "boot1", handled)
    assert decode_reply(encode_reply(reply), expected_groups=len(outcomes)) == reply


def _reply_with(**fields) -> bytes:
    header, _ = unframe(encode_reply(Reply(seq=1, learner="boot1")), REPLY_MAGIC, 1 << 20, WireError)
    return frame(REPLY_MAGIC, {**header, **fields})


@pytest.mark.parametrize(
    ("field", "value"),
    [("handled", -1.0), ("handled", 1e9), ("handled", True), ("handled", "0.1"), ("retry_after", -0.5)],
)
def test_a_reply_field_out_of_bounds_is_refused_by_name(field: str, value) -> None:
    with pytest.raises(WireError, match=field):
        decode_reply(_reply_with(**{field: value}))


def test_an_upload_without_its_used_total_is_refused() -> None:
    header, _ = unframe(encode_upload(Upload("a", "s", 0, 0, used=2)), UPLOAD_MAGIC, 1 << 20, WireError)
    del header["used"]
    with pytest.raises(WireError, match="used"):
        decode_upload(frame(UPLOAD_MAGIC, header))
