"""The HTTP layer itself, over real sockets: requests aiohttp cannot parse, a token that is not UTF-8, slow and
idle connections, too many connections and a handler bug each get an answer (or a close) and a count in
/v1/status; nothing reaches the log as a traceback."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from heterorl.eventlog import EventLog
from heterorl.live.learner_node import LiveLearner
from heterorl.loop.protocol import Upload
from heterorl.transport.http.service import make_runner
from heterorl.transport.wire import REPLY_MAGIC, decode_reply, encode_upload
from transport.test_service import REWARD, TOKEN, make_live, varied_reward  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("varied_reward")


@asynccontextmanager
async def served(live: LiveLearner) -> AsyncIterator[tuple[str, int]]:
    runner = make_runner(live, TOKEN)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield "127.0.0.1", runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def exchange(addr: tuple[str, int], request: bytes, timeout: float = 10.0) -> tuple[int, dict]:
    """Send raw bytes on a new connection, read one answer; (status, JSON body or {})."""
    reader, writer = await asyncio.open_connection(*addr)
    writer.write(request)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    lines = head.decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await asyncio.wait_for(reader.readexactly(int(fields.get("content-length", 0))), timeout)
    writer.close()
    return int(lines[0].split(" ", 2)[1]), answer_of(body)


def answer_of(body: bytes) -> dict:
    """A JSON answer as it is, a reply (`transport.wire`) as {"outcome": its refusal or first verdict, ...}."""
    if body.startswith(REPLY_MAGIC):
        reply = decode_reply(body)
        outcome = reply.refused or (reply.verdicts[0].outcome if reply.verdicts else "")
        return {"outcome": outcome, "detail": reply.detail}
    return json.loads(body) if body.startswith(b"{") else {}


async def status_of(addr: tuple[str, int]) -> dict:
    code, body = await exchange(addr, b"GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert code == 200
    return body


def make(tmp_path: Path, tiny_model_dir: Path, *overrides: str) -> tuple[LiveLearner, io.StringIO]:
    log = io.StringIO()
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, *overrides, events=EventLog(log))
    live.loop.publisher.result()  # version 0 is served (else POSTs get 503 not_ready)
    return live, log


def test_a_token_that_is_not_utf8_is_refused_and_counted(tmp_path: Path, tiny_model_dir: Path) -> None:
    live, log = make(tmp_path, tiny_model_dir)

    async def scenario() -> dict:
        async with served(live) as addr:
            for route in (b"POST /v1/exchange", b"GET /v1/weights"):
                request = route + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\xc3(\r\n"
                code, body = await exchange(addr, request + b"Content-Length: 0\r\nConnection: close\r\n\r\n")
                assert (code, body["outcome"]) == (401, "unauthorized"), route
            return await status_of(addr)

    status = asyncio.run(scenario())
    assert status["rejected"] == {"unauthorized": 2}
    assert "Traceback" not in log.getvalue()


UNPARSABLE = {
    "Content-Length that is not a number": b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "chunk size that is not hex": (
        b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"
    ),
    "Transfer-Encoding with Content-Length": (
        b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n"
    ),
    "request line of 20,000 bytes": b"GET /v1/status?" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "header of 20,000 bytes": b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Junk: " + b"j" * 20_000 + b"\r\n\r\n",
    "not HTTP at all": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 TLS hello\r\n\r\n",
}


def test_requests_the_http_layer_cannot_parse_are_answered_and_counted(tmp_path: Path, tiny_model_dir: Path) -> None:
    live, log = make(tmp_path, tiny_model_dir)

    async def scenario() -> dict:
        async with served(live) as addr:
            for name, request in UNPARSABLE.items():
                code, body = await exchange(addr, request)
                assert code == 400, name
                assert body["outcome"] == "bad_http", name
                assert body["detail"], name
            return await status_of(addr)

    status = asyncio.run(scenario())
    assert status["rejected"] == {"bad_http": len(UNPARSABLE)}
    assert "Traceback" not in log.getvalue()
    lines = [json.loads(x) for x in log.getvalue().splitlines() if '"http_error"' in x]
    assert len(lines) == len(UNPARSABLE)  # one event line each


def test_slow_and_idle_connections_are_closed_and_extra_ones_refused(tmp_path: Path, tiny_model_dir: Path) -> None:
    live, _ = make(tmp_path, tiny_model_dir, "live.header_timeout_s=0.5", "live.max_connections=8")

    async def slow_loris(addr: tuple[str, int]) -> float:
        """One byte every 0.1 s of a request head that never ends: closed after the header timeout."""
        reader, writer = await asyncio.open_connection(*addr)
        began = time.monotonic()
        try:
            for byte in b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 200:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.1)
                if reader.at_eof():
                    break
            await asyncio.wait_for(reader.read(), 5)
        except ConnectionError:
            pass
        writer.close()
        return time.monotonic() - began

    async def scenario() -> tuple[float, list[bytes], dict]:
        async with served(live) as addr:
            held = await slow_loris(addr)
            idle = [await asyncio.open_connection(*addr) for _ in range(20)]
            answers = [await asyncio.wait_for(reader.read(), 5) for reader, _ in idle]  # closed, all of them
            for _, writer in idle:
                writer.close()
            return held, answers, await status_of(addr)

    held, answers, status = asyncio.run(scenario())
    assert held < 3.0  # not for as long as it liked (20 s of bytes)
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
    assert len(refused) == 20 - 8  # beyond max_connections: answered at once
    assert all(a == b"" for a in answers if a not in refused)  # idle ones: closed after the header timeout
    assert status["rejected"] == {"timeout": 1, "too_many_connections": 12}


def test_a_body_that_does_not_arrive_in_time_gets_408(tmp_path: Path, tiny_model_dir: Path) -> None:
    live, _ = make(tmp_path, tiny_model_dir, "live.body_timeout_s=0.5")

    async def scenario() -> tuple[int, dict, dict]:
        async with served(live) as addr:
            reader, writer = await asyncio.open_connection(*addr)
            head = f"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 900\r\n"
            writer.write(head.encode() + b"\r\n" + b"x" * 10)  # then nothing
            head_bytes = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = int(head_bytes.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            body = await asyncio.wait_for(reader.readexactly(length), 10)
            writer.close()
            return int(head_bytes.split(b" ")[1]), answer_of(body), await status_of(addr)

    code, body, status = asyncio.run(scenario())
    assert (code, body["outcome"]) == (408, "timeout")
    assert status["rejected"] == {"timeout": 1}


def test_a_handler_bug_is_a_counted_500_in_one_log_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    live, log = make(tmp_path, tiny_model_dir)

    def broken(upload: Upload) -> None:
        raise KeyError("a bug")

    live.loop.exchange = broken  # type: ignore[method-assign]
    upload = encode_upload(Upload("sampler-0", "s", 0, 0))

    async def scenario() -> tuple[int, dict, dict]:
        async with served(live) as addr:
            request = f"POST /v1/exchange HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            length = f"Content-Length: {len(upload)}\r\nConnection: close\r\n\r\n"
            code, body = await exchange(addr, (request + length).encode() + upload)
            return code, body, await status_of(addr)

    code, body, status = asyncio.run(scenario())
    assert (code, body["outcome"]) == (500, "internal_error")
    assert status["rejected"] == {"internal_error": 1}
    assert "Traceback" not in log.getvalue()
    assert "KeyError" in log.getvalue()
