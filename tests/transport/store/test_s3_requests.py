"""What an s3:// store sends: a small PUT carries its body at once (no `Expect: 100-continue` round trip), a
listing is one LIST request, found or not (s3fs's `find` added a HEAD and a second LIST for an empty prefix), and
objects deleted together one DeleteObjects request; timestamps parsed as botocore parses them, only cheaper."""

from __future__ import annotations

import io

import pytest
from botocore.awsrequest import AWSRequest
from botocore.utils import parse_timestamp

from heterorl.config import StoreConfig
from heterorl.transport.store.objects import CONTINUE_MIN_BYTES, FsspecStore, _no_continue_for_small_puts, _timestamp
from transport.store.conftest import MOTO_ENV, make_bucket


@pytest.mark.parametrize(
    ("size", "kept"), [(0, False), (4_000, False), (CONTINUE_MIN_BYTES - 1, False), (CONTINUE_MIN_BYTES, True)]
)
def test_only_a_large_put_waits_for_100_continue(size, kept):
    request = AWSRequest(
        "PUT", "http://store/bucket/key", headers={"Expect": "100-continue"}, data=io.BytesIO(b"x" * size)
    )
    _no_continue_for_small_puts(request)
    assert ("Expect" in request.headers) is kept


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-27T16:53:07.000Z",  # a listing's LastModified
        "2026-11-27T16:53:07Z",
        "2026-11-27T16:53:07.123456+02:00",
        "Fri, 27 Nov 2026 16:53:07 GMT",  # a GET's Last-Modified header
        "1795797493",  # epoch seconds: left to botocore's own parser
    ],
)
def test_timestamps_parse_as_botocores_parser_reads_them(text):
    assert _timestamp(text) == parse_timestamp(text)
    assert _timestamp(text).utcoffset() == parse_timestamp(text).utcoffset()


def test_a_small_put_is_one_request_and_a_listing_one_list(moto_endpoint, monkeypatch):
    for key, value in MOTO_ENV.items():
        monkeypatch.setenv(key, value)
    store = FsspecStore(StoreConfig(url=f"s3://{make_bucket(moto_endpoint)}/run", endpoint_url=moto_endpoint))
    sent: list[tuple[str, str, dict]] = []
    emitter = store.fs.session.get_component("event_emitter")  # before the first call creates the client
    emitter.register("before-send.s3", lambda request, **_: sent.append((request.method, request.url, request.headers)))

    store.put("up/a/1.up", b"u" * 4_000)
    assert [(m, "Expect" in h) for m, _, h in sent] == [("PUT", False)]

    sent.clear()
    assert [(o.key, o.size) for o in store.list("up/")] == [("up/a/1.up", 4_000)]
    assert [m for m, _, _ in sent] == ["GET"]
    assert "list-type=2" in sent[0][1]

    sent.clear()
    assert list(store.list("down/")) == []
    assert len(sent) == 1


def test_objects_deleted_together_are_one_request(moto_endpoint, monkeypatch):
    for key, value in MOTO_ENV.items():
        monkeypatch.setenv(key, value)
    store = FsspecStore(StoreConfig(url=f"s3://{make_bucket(moto_endpoint)}/run", endpoint_url=moto_endpoint))
    sent: list[tuple[str, str]] = []
    emitter = store.fs.session.get_component("event_emitter")  # before the first call creates the client
    emitter.register("before-send.s3", lambda request, **_: sent.append((request.method, request.url)))
    for i in range(3):
        store.put(f"down/a/{i}.reply", b"r")
    sent.clear()
    store.delete_many([f"down/a/{i}.reply" for i in range(3)] + ["down/a/never-there.reply"])  # missing is fine
    assert [m for m, _ in sent] == ["POST"]  # DeleteObjects
    assert "delete" in sent[0][1]
    assert list(store.list("down/")) == []
