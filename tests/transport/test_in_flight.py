"""`InFlight`: results reach their callbacks, the first error fails `failed` (awaiting it raises that error), and
an error nobody awaits (a side shutting down) is never printed as "Future exception was never retrieved"."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from heterorl.transport.in_flight import InFlight


async def _fails(message: str) -> None:
    await asyncio.sleep(0)
    raise RuntimeError(message)


def test_results_reach_their_callbacks_and_the_first_error_fails_the_side() -> None:
    async def scenario() -> list[int]:
        got: list[int] = []
        requests = InFlight()
        requests.run(asyncio.sleep(0, result=1), got.append)
        requests.run(_fails("first"), got.append)
        await requests.settle(1.0)
        requests.run(_fails("second"), got.append)
        await requests.settle(1.0)
        with pytest.raises(RuntimeError, match="first"):
            await requests.failed
        return got

    assert asyncio.run(scenario()) == [1]


def test_an_error_nobody_awaits_is_not_printed(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        requests = InFlight()
        requests.run(_fails("Session is closed"), lambda _: None)
        await requests.settle(1.0)  # the side shuts down without awaiting `failed`

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(scenario())
        gc.collect()
    assert "never retrieved" not in caplog.text
