"""What one authenticated client can make the learner hold is bounded: a body no larger than the largest upload
the learner could accept, a fixed number of bodies read at once, and only the run's own sampler names in the
public status and in the metrics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from heterorl.transport.http.service import max_upload_bytes
from transport.test_http_guard import exchange, make, served, status_of
from transport.test_service import TOKEN, varied_reward  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("varied_reward")
AUTH = f"Authorization: Bearer {TOKEN}\r\n".encode()


def test_a_body_larger_than_any_valid_upload_is_refused_unread(tmp_path: Path, tiny_model_dir: Path) -> None:
    live, _ = make(tmp_path, tiny_model_dir, "live.max_body_bytes=16777216", "cluster.groups_per_upload=4")
    largest = max_upload_bytes(live.cfg, live.loop.intake.limits(0))
    assert largest < 400_000  # 4 groups of G=4, 3 new tokens, a 64-token context: far from 16 MiB

    async def scenario() -> tuple[int, dict, dict]:
        async with served(live) as addr:
            head = b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\n" + AUTH
            request = head + f"Content-Length: {largest + 1}\r\nConnection: close\r\n\r\n".encode()
            code, body = await exchange(addr, request + b"z" * (largest + 1))
            return code, body, await status_of(addr)

    code, body, status = asyncio.run(scenario())
    assert (code, body["outcome"]) == (413, "too_large")
    assert status["rejected"] == {"too_large": 1}


def test_uploads_beyond_the_limit_are_turned_away_busy(tmp_path: Path, tiny_model_dir: Path) -> None:
    live, _ = make(tmp_path, tiny_model_dir, "live.max_concurrent_uploads=2")
    head = b"POST /v1/exchange HTTP/1.1\r\nHost: x\r\n" + AUTH + b"Content-Length: 1000\r\n\r\n"

    async def scenario() -> tuple[list[int], dict]:
        async with served(live) as addr:
            slow = []
            for _ in range(2):  # two uploads that have sent 10 of their 1000 bytes
                reader, writer = await asyncio.open_connection(*addr)
                writer.write(head + b"x" * 10)
                await writer.drain()
                slow.append((reader, writer))
            await asyncio.sleep(0.3)
            codes = []
            for _ in range(3):
                code, body = await exchange(addr, head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + b"x")
                codes.append(code)
                assert body["outcome"] == "busy"
            for reader, writer in slow:  # they finish: uploads are read again
                writer.write(b"x" * 990)
                await writer.drain()
                await asyncio.wait_for(reader.readuntil(b"}"), 10)
                writer.close()
            code, _ = await exchange(addr, head.replace(b"1000", b"3") + b"abc")
            codes.append(code)
            return codes, await status_of(addr)

    codes, status = asyncio.run(scenario())
    assert codes == [503, 503, 503, 400]  # the last one is read (and is not a rollout message)
    assert status["busy"] == 3
    assert status["rejected"] == {"malformed": 3}


def test_made_up_sampler_names_are_not_remembered(tmp_path: Path, tiny_model_dir: Path) -> None:
    live, _ = make(tmp_path, tiny_model_dir, "cluster.samplers=[{name: a}, {name: b}]")

    async def scenario() -> dict:
        async with served(live) as addr:
            for i in range(60):
                query = f"/v1/weights?sampler=intruder-{i}&wait=0&idle=0.5&failed=3".encode()
                code, _ = await exchange(addr, b"GET " + query + b" HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n")
                assert code == 200
            code, _ = await exchange(addr, b"GET /v1/weights?sampler=a HTTP/1.1\r\nHost: x\r\n" + AUTH + b"\r\n")
            assert code == 200
            return await status_of(addr)

    status = asyncio.run(scenario())
    assert status["connected"] == ["a"]
    assert list(status["samplers"]) == ["a"]
    assert len(json.dumps(status)) < 2000
    record = live.loop._record({}, live.loop.publisher.result())
    assert not [k for k in record if "intruder" in k]
    assert record["net/weights_failed_total"] == 0.0
