"""The learner loop and a real sampler in one process, joined only by a store (file:// and moto's S3 server)."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from pathlib import Path

import pytest

from heterorl.eventlog import EventLog
from heterorl.live.sampler_node import serve_sampler
from heterorl.live.transports import open_learner_store
from heterorl.loop.worker import SamplerWorker
from heterorl.policy import Policy, SamplingParams
from heterorl.sampler import Sampler
from heterorl.tasks import make_task
from transport.test_service import REWARD, make_live, varied_reward  # noqa: F401 (a fixture)

STORE = ["transport.weights=store", "transport.rollouts=store", "transport.store.poll_seconds=0.05"]


def events_of(stream: io.StringIO, name: str) -> list[dict]:
    return [e for e in map(json.loads, stream.getvalue().splitlines()) if e["event"] == name]


@pytest.mark.usefixtures("varied_reward")
def test_learner_and_sampler_through_the_store(tmp_path: Path, tiny_model_dir: Path, store_overrides: list[str]):
    learner_log, sampler_log = io.StringIO(), io.StringIO()
    live = make_live(
        tmp_path / "run",
        tiny_model_dir,
        REWARD,
        *STORE,
        *store_overrides,
        "learner.steps=4",
        "weights.codec=pulse",
        "cluster.samplers=[{name: sampler-0}]",
        events=EventLog(learner_log),
    )
    store = open_learner_store(live, resume=False)
    assert store is not None
    cfg = live.cfg
    # make_live published version 0 before the store side was attached: publish it through the store now
    store.publisher.published(live.loop.publisher.result())
    store.start()
    params = SamplingParams.from_config(cfg.sampler)
    sampler = Sampler.from_policy("sampler-0", Policy.load(tiny_model_dir), make_task(cfg.task), params, 4, 3)
    worker = SamplerWorker(cfg, 0, sampler)
    trainer = threading.Thread(target=live.train, daemon=True)

    async def scenario() -> dict:
        events = EventLog(sampler_log)
        trainer.start()
        return await asyncio.wait_for(serve_sampler(cfg, worker, events=events), 120)

    result = asyncio.run(scenario())
    trainer.join(timeout=60)
    store.close()
    assert live.finished
    assert live.loop.learner.version == 4
    assert result["outcomes"]["accepted"] >= 16
    published = {(e["version"], e["hash"]) for e in events_of(learner_log, "published")}
    held = {(e["version"], e["hash"]) for e in events_of(sampler_log, "weights") if e["ok"]}
    assert held
    assert held <= published
    assert store.summary()["intake"]["answered"] >= 1


@pytest.mark.usefixtures("varied_reward")
def test_a_store_thread_that_fails_stops_the_run_saying_why(tmp_path: Path, tiny_model_dir: Path) -> None:
    """An error the store thread cannot retry (here a store that refuses the learner's reads) must not leave the
    learner waiting for groups that no longer come: the thread records it, logs it and stops the run."""
    log = io.StringIO()
    store_url = f"transport.store.url={(tmp_path / 'store').as_uri()}"
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, *STORE, store_url, events=EventLog(log))
    store = open_learner_store(live, resume=False)
    assert store is not None

    def refused() -> int:
        raise PermissionError(13, "Permission denied", "up/")

    store.intake.poll = refused
    store.start()
    store._thread.join(timeout=30)
    assert not store._thread.is_alive()
    assert store.error == "PermissionError: [Errno 13] Permission denied: 'up/'"
    assert live.stop.is_set()  # the training thread returns after its step, checkpointed (resumable)
    (failed,) = [e for e in events_of(log, "store") if e.get("fault") == "failed"]
    assert failed["detail"] == store.error
    store.close()
