"""A dead link is noticed within `live.dead_after_s`, reported, and left cleanly when it comes back: a real sampler
session and the real service, joined through a TCP relay that turns into a black hole (connections stay open,
nothing passes: what a lost route does to TCP) in the middle of the run."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from heterorl.eventlog import EventLog
from heterorl.live.sampler_node import serve_sampler
from heterorl.loop.worker import SamplerWorker
from heterorl.run.build import build_sampler
from heterorl.transport.http.service import build_app
from heterorl.transport.tcp_relay import TcpRelay
from transport.test_service import REWARD, TOKEN, make_live, varied_reward  # noqa: F401 (a fixture)

DEAD_AFTER_S = 1.0
CUT_S = 4.0


@pytest.mark.usefixtures("varied_reward")
def test_a_black_hole_is_noticed_within_the_bound_and_the_run_goes_on_after_it(tmp_path: Path, tiny_model_dir: Path):
    live = make_live(
        tmp_path / "run",
        tiny_model_dir,
        REWARD,
        "learner.steps=12",
        "cluster.mode=async",
        f"live.dead_after_s={DEAD_AFTER_S}",
        "live.poll_seconds=0.5",
        "live.backoff_initial_s=0.05",
        "live.backoff_max_s=0.2",
    )
    cfg = live.cfg
    worker = SamplerWorker(cfg, 0, build_sampler(cfg, 0, base=str(tiny_model_dir)))
    log = io.StringIO()
    trainer = threading.Thread(target=live.train, daemon=True)
    cut_at: list[float] = []

    async def scenario() -> dict:
        async with TestServer(build_app(live, TOKEN)) as server:
            relay = TcpRelay(("127.0.0.1", server.port))
            trainer.start()

            async def cut() -> None:
                while live.loop.learner.version < 3:
                    await asyncio.sleep(0.05)
                relay.blackhole()
                cut_at.append(time.time())
                await asyncio.sleep(CUT_S)
                relay.restore()

            cutter = asyncio.ensure_future(cut())
            try:
                url = f"http://{relay.url_host}"
                return await asyncio.wait_for(serve_sampler(cfg, worker, url, TOKEN, EventLog(log)), 120)
            finally:
                await cutter
                relay.close()

    result = asyncio.run(scenario())
    trainer.join(timeout=60)
    assert live.finished
    events = [json.loads(line) for line in log.getvalue().splitlines()]
    down = [e["t"] for e in events if e["event"] == "link_down"]
    up = [e["t"] for e in events if e["event"] == "link_up"]
    assert down, "the black hole was never noticed"
    noticed = down[0] - cut_at[0]
    # a request in flight notices after dead_after_s without a byte (+ scheduling slack on a loaded machine)
    assert 0 < noticed <= DEAD_AFTER_S + 1.5, noticed
    assert up
    assert up[0] >= cut_at[0] + CUT_S - 0.5  # reported up only once bytes pass again
    assert result["transport"]["link_down"] >= 1
    # the run went on: every step trained on this one sampler's groups, some accepted after the link came back
    assert live.loop.learner.version == cfg.learner.steps
    after = [e for e in events if e["event"] == "pushed" and e["outcome"] == "accepted" and e["t"] > up[0]]
    assert after, "nothing was accepted after the link came back"
    # the sampler's own account: an upload the transport gave up on may still have arrived and been trained (its
    # reply was what the black hole ate), so the groups it holds answered plus those lost cover the trained ones
    lost = sum(e["groups"] for e in events if e["event"] == "undeliverable")
    assert result["outcomes"]["accepted"] + lost >= cfg.learner.steps * cfg.learner.groups_per_step
