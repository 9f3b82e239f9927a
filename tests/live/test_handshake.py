"""A sampler whose config does not match its learner's -- another task, another group size, a name the learner does
not know -- is refused at its first upload, over HTTP and through the store: one line on each side names what
differs, the sampler stops at once, and the learner takes nothing from it."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from heterorl.config import RunConfig
from heterorl.eventlog import EventLog
from heterorl.live.sampler_node import SamplerStoppedError, serve_sampler
from heterorl.live.transports import open_learner_store
from heterorl.loop.worker import SamplerWorker
from heterorl.run.build import build_sampler
from heterorl.transport.http.service import build_app
from transport.test_service import REWARD, TOKEN, make_live, varied_reward  # noqa: F401 (a fixture)

MISMATCHES = {
    "another task": (("task", {"name": "reversal", "alphabet": "ab", "eval_size": 8}), "config_mismatch", "task."),
    "another group size": (("sampler", {"group_size": 2}), "config_mismatch", "sampler.group_size"),
    "an unknown name": (("cluster", {"samplers": [{"name": "stranger"}]}), "unknown_sampler", "'stranger'"),
}


def refused_lines(log: io.StringIO) -> list[dict]:
    return [e for e in map(json.loads, log.getvalue().splitlines()) if e["event"] == "refused"]


@pytest.mark.usefixtures("varied_reward")
@pytest.mark.parametrize("transport", ["http", "store"])
@pytest.mark.parametrize("mismatch", sorted(MISMATCHES))
def test_a_sampler_that_does_not_match_is_refused_and_stops_with_one_line(
    tmp_path: Path, tiny_model_dir: Path, transport: str, mismatch: str
) -> None:
    overrides, reason, named = MISMATCHES[mismatch]
    store = ["transport.rollouts=store", f"transport.store.url=file://{tmp_path / 'store'}"]
    shared = [REWARD, *(store if transport == "store" else [])]
    learner_log = io.StringIO()
    live = make_live(tmp_path / "run", tiny_model_dir, *shared, events=EventLog(learner_log))
    store_side = open_learner_store(live, resume=False) if transport == "store" else None
    if store_side is not None:
        store_side.start()
    section, change = overrides
    settings = live.cfg.model_dump(mode="json")
    settings[section] = change if section == "task" else {**settings[section], **change}
    other = RunConfig.model_validate(settings)  # the learner's config but for one section
    worker = SamplerWorker(other, 0, build_sampler(other, 0, base=str(tiny_model_dir)))
    sampler_log = io.StringIO()

    async def scenario() -> None:
        async with TestServer(build_app(live, TOKEN)) as server:
            url = str(server.make_url(""))
            await asyncio.wait_for(serve_sampler(other, worker, url, TOKEN, EventLog(sampler_log)), 120)

    with pytest.raises(SamplerStoppedError, match=rf"refused it as '{reason}'.*{named}") as stopped:
        asyncio.run(scenario())
    if store_side is not None:
        store_side.close()
    assert len(str(stopped.value).splitlines()) == 1
    (line,) = {(e["reason"], e["detail"]) for e in refused_lines(learner_log)}  # the same line each time
    assert line[0] == reason
    assert named in line[1]
    assert live.loop.intake.counters.accepted == 0
    assert live.loop.intake.counters.rejected[reason] >= 1
