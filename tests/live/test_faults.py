"""A real sampler session against the real service, in one process, over an emulated faulty link: corrupted and
duplicated groups are refused or deduplicated, dropped uploads are sent again, corrupted weight updates are
refused and recovered from with a snapshot, and the run still completes with every held weight hash equal to a
published one."""

from __future__ import annotations

import asyncio
import io
import json
import random
import threading
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from heterorl.eventlog import EventLog
from heterorl.live.sampler_node import serve_sampler
from heterorl.loop.worker import SamplerWorker
from heterorl.policy import Policy, SamplingParams
from heterorl.sampler import Sampler
from heterorl.tasks import make_task
from heterorl.transport.backoff import Backoff
from heterorl.transport.http.service import build_app
from transport.test_service import REWARD, TOKEN, make_live, varied_reward  # noqa: F401 (a fixture)

FAULTY = (
    "cluster.samplers=[{name: sampler-0, link: {"
    "rollout_faults: {corrupt: 0.4, duplicate: 0.4, drop: 0.15}, "
    "weights_faults: {corrupt: 0.4, duplicate: 0.3, drop: 0.2}}}]"
)


def events_of(stream: io.StringIO, name: str) -> list[dict]:
    return [e for e in map(json.loads, stream.getvalue().splitlines()) if e["event"] == name]


@pytest.mark.usefixtures("varied_reward")
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_sampler_over_a_faulty_link_still_trains_the_learner(tmp_path: Path, tiny_model_dir: Path, mode: str):
    learner_log, sampler_log = io.StringIO(), io.StringIO()
    live = make_live(
        tmp_path / "run",
        tiny_model_dir,
        REWARD,
        FAULTY,
        "live.emulate_links=true",
        "live.backoff_initial_s=0.01",
        "live.backoff_max_s=0.05",
        "live.poll_seconds=1",
        "learner.steps=4",
        "cluster.groups_per_upload=1",  # an upload per group: enough uploads that each fault surely happens
        "weights.codec=pulse",
        f"cluster.mode={mode}",
        events=EventLog(learner_log),
    )
    cfg = live.cfg
    params = SamplingParams.from_config(cfg.sampler)
    sampler = Sampler.from_policy(
        "sampler-0", Policy.load(tiny_model_dir), make_task(cfg.task), params, cfg.sampler.group_size, 3
    )
    worker = SamplerWorker(cfg, 0, sampler)
    trainer = threading.Thread(target=live.train, daemon=True)

    async def scenario() -> dict:
        async with TestServer(build_app(live, TOKEN)) as server:
            trainer.start()
            url = str(server.make_url(""))
            return await asyncio.wait_for(serve_sampler(cfg, worker, url, TOKEN, EventLog(sampler_log)), 120)

    result = asyncio.run(scenario())
    trainer.join(timeout=30)
    assert live.finished
    assert live.loop.learner.version == 4
    counters = live.loop.intake.counters
    assert counters.rejected["corrupt"] >= 1  # a flipped byte is caught by the digest, whatever it hit
    assert counters.duplicates >= 1  # a duplicated POST is acknowledged but not queued twice
    assert counters.accepted == len(live.loop.intake.consumed) + len(live.loop.intake.buffer)
    assert result["transport"]["emulated_drop"] >= 1  # dropped uploads were sent again

    published = {(e["version"], e["hash"]) for e in events_of(learner_log, "published")}
    weights = events_of(sampler_log, "weights")
    held = [(e["version"], e["hash"]) for e in weights if e["ok"]]
    assert held
    assert set(held) <= published
    refused = [i for i, e in enumerate(weights) if not e["ok"]]
    assert refused, "with 40% corruption some update must have been refused"
    after = [e for e in weights[refused[0] + 1 :] if e["ok"]]
    assert after[0]["kind"] == "snapshot"  # the receiver asked for a snapshot after the refusal
    pushed = [e["group_id"] for e in events_of(sampler_log, "pushed") if e["outcome"] in ("accepted", "duplicate")]
    assert set(pushed) <= set(live.loop.intake.consumed) | set(live.loop.intake.payloads)


def test_backoff_doubles_up_to_the_cap_with_jitter() -> None:
    backoff = Backoff(0.1, 1.0, random.Random(0))
    delays = [backoff.next_delay() for _ in range(8)]
    bases = [min(1.0, 0.1 * 2**k) for k in range(8)]
    assert all(b / 2 <= d <= b for d, b in zip(delays, bases, strict=True))
    assert len(set(delays)) == len(delays)
    backoff.reset()
    assert backoff.next_delay() <= 0.1
