"""SIGTERM to a live sampler (`stop_on_signals`, as `heterorl sampler` runs it) ends its session in order wherever
the session is: mid-run against a real service, or still retrying a learner that is not up. The signal is sent to
the process from another thread (the kernel may hand it to any thread). Afterwards: the caller gets
SamplerInterruptedError (`run_sampler` turns it into KeyboardInterrupt), the log says which signal, the sampler's
threads have ended, the previous handlers are back."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import pytest
from aiohttp.test_utils import TestServer

from heterorl.eventlog import EventLog
from heterorl.live.sampler_node import SamplerInterruptedError, serve_sampler
from heterorl.loop.worker import SamplerWorker
from heterorl.run.build import build_sampler
from heterorl.transport.http.service import build_app
from transport.test_service import REWARD, TOKEN, make_live, varied_reward  # noqa: F401 (a fixture)

SAMPLER_THREADS = ("generate", "weights")
BACKOFF_S = 30.0
UNTIL_S = 60.0  # a session the signal did not end fails the test (TimeoutError) instead of hanging it


def sigterm_when(ready: Callable[[], bool], timeout: float = 120.0) -> threading.Thread:
    """SIGTERM to this process, from a thread of its own, once `ready()`."""

    def wait_then_signal() -> None:
        deadline = time.monotonic() + timeout
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=wait_then_signal, daemon=True)
    thread.start()
    return thread


def interrupted_in_order(run: Callable[[], object], log: io.StringIO) -> float:
    """Run `run` (which must end by SIGTERM) under a marker SIGTERM handler; the seconds it took to end."""
    calls: list[int] = []

    def marker(signum: int, frame: FrameType | None) -> None:
        calls.append(signum)

    previous = signal.signal(signal.SIGTERM, marker)
    try:
        began = time.monotonic()
        with pytest.raises(SamplerInterruptedError, match="SIGTERM ended sampler sampler-0"):
            run()
        took = time.monotonic() - began
        assert signal.getsignal(signal.SIGTERM) is marker  # the caller's handler is back
        assert not calls  # the signal went to the session, not to the caller's handler
    finally:
        signal.signal(signal.SIGTERM, previous)
    events = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [e["signal"] for e in events if e["event"] == "interrupted"] == ["SIGTERM"]
    assert not [t.name for t in threading.enumerate() if t.name.startswith(SAMPLER_THREADS)]
    return took


@pytest.mark.usefixtures("varied_reward")
def test_sigterm_mid_run_ends_the_session_in_order(tmp_path: Path, tiny_model_dir: Path) -> None:
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, "learner.steps=1000", "cluster.mode=async")
    cfg = live.cfg
    worker = SamplerWorker(cfg, 0, build_sampler(cfg, 0, base=str(tiny_model_dir)))
    log = io.StringIO()
    trainer = threading.Thread(target=live.train, daemon=True)

    async def scenario() -> None:
        async with TestServer(build_app(live, TOKEN)) as server:
            trainer.start()
            sigterm_when(lambda: live.loop.learner.version >= 2)
            session = serve_sampler(cfg, worker, str(server.make_url("")), TOKEN, EventLog(log), stop_on_signals=True)
            await asyncio.wait_for(session, UNTIL_S)

    try:
        interrupted_in_order(lambda: asyncio.run(scenario()), log)
    finally:
        live.request_stop()
        trainer.join(timeout=60)
    assert live.loop.learner.version >= 2
    assert any(json.loads(line)["event"] == "generated" for line in log.getvalue().splitlines())


def test_sigterm_while_the_learner_is_not_up_yet_ends_the_session(tmp_path: Path, tiny_model_dir: Path) -> None:
    from conftest import tiny_config

    with socket.socket() as s:  # a port nobody listens on: the sampler retries it
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    cfg = tiny_config(tiny_model_dir, f"live.backoff_initial_s={BACKOFF_S}", f"live.backoff_max_s={BACKOFF_S}")
    worker = SamplerWorker(cfg, 0, build_sampler(cfg, 0, base=str(tiny_model_dir)))
    log = io.StringIO()

    def retrying() -> bool:
        return '"event": "retry"' in log.getvalue()

    sigterm_when(retrying)
    session = serve_sampler(cfg, worker, url, TOKEN, EventLog(log), stop_on_signals=True)
    took = interrupted_in_order(lambda: asyncio.run(asyncio.wait_for(session, UNTIL_S)), log)
    assert took < BACKOFF_S / 2  # at once, not after the retry it waits for
