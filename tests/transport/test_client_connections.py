"""The sampler's HTTP client keeps its weight pulls on a connection of their own, apart from the uploads: a pull
never lands on a connection an upload used (whose congestion window the small replies never grew), and
consecutive pulls reuse one connection (whose window the previous update grew). Real TCP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import io
import random

from aiohttp import web

from heterorl.config import LiveConfig
from heterorl.eventlog import EventLog
from heterorl.loop.protocol import GroupVerdict, Reply, Upload
from heterorl.transport.http.client import LearnerClient
from heterorl.transport.wire import decode_upload, encode_reply


async def _serve(ports: dict[str, list[int]]) -> web.AppRunner:
    async def exchange(request: web.Request) -> web.Response:
        ports["exchange"].append(request.transport.get_extra_info("peername")[1])
        upload = decode_upload(await request.read())
        await asyncio.sleep(0.05)  # several uploads are in flight at once
        verdicts = tuple(GroupVerdict("accepted") for _ in upload.groups)
        return web.Response(body=encode_reply(Reply(seq=upload.seq, verdicts=verdicts)))

    async def weights(request: web.Request) -> web.Response:
        ports["weights"].append(request.transport.get_extra_info("peername")[1])
        return web.Response(body=b"\x00" * 200_000)  # an update's worth of bytes

    app = web.Application()
    app.router.add_post("/v1/exchange", exchange)
    app.router.add_get("/v1/weights", weights)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


async def _talk() -> dict[str, list[int]]:
    ports: dict[str, list[int]] = {"exchange": [], "weights": []}
    runner = await _serve(ports)
    port = runner.addresses[0][1]
    try:
        client = LearnerClient(
            f"http://127.0.0.1:{port}", "t" * 32, LiveConfig(), "a", "boot", random.Random(0), EventLog(io.StringIO())
        )
        async with client:
            for round_no in range(4):
                uploads = [client.exchange(Upload("a", "boot", seq=4 * round_no + i, version=0)) for i in range(4)]
                await asyncio.gather(*uploads)  # then idle connections an upload used wait in the pool
                pulled = await client.pull((0, "h"), 0.0, None, 0)
                assert isinstance(pulled, bytes)
                assert len(pulled) == 200_000
    finally:
        await runner.cleanup()
    return ports


def test_weight_pulls_keep_one_connection_of_their_own() -> None:
    ports = asyncio.run(_talk())
    assert len(ports["exchange"]) == 16
    assert len(ports["weights"]) == 4
    assert len(set(ports["weights"])) == 1, ports  # one connection carries every pull
    assert not set(ports["weights"]) & set(ports["exchange"]), ports  # and no upload
    assert len(set(ports["exchange"])) > 1  # the uploads were in flight at once, on connections of the pool
