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


def test_close_ends_what_is_in_flight_and_refuses_new_work() -> None:
    """A stopped sampler: nothing left pending when its loop closes, nothing started after (a request started by an
    answer that arrived during shutdown printed "Task was destroyed but it is pending!")."""

    async def scenario() -> tuple[bool, int, list[str]]:
        flight = InFlight()
        answers: list[str] = []
        flight.run(asyncio.sleep(30, "late"), answers.append)
        await asyncio.sleep(0)
        await flight.close(timeout=5)
        gone = not flight.tasks
        never = asyncio.sleep(0, "refused")
        flight.run(never, answers.append)
        await asyncio.sleep(0.01)
        return gone, never.cr_frame is None, answers  # closed, not left un-awaited

    gone, closed, answers = asyncio.run(scenario())
    assert gone
    assert closed
    assert answers == []
