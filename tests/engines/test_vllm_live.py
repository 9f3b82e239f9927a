"""A live sampler generating with vLLM: the wall clock's driver (`serve_sampler`: a `SamplerNode` on a
`WallRuntime`, HTTP to a learner serving in this process) runs the `SamplerWorker` on the vLLM engine -- chunks in
flight together, PULSE patches decoded and hash-checked by the worker's `WeightReceiver`, then loaded in place
while completions run (interruptible). The simulated clock runs the same worker: test_vllm_run.py."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from heterorl.config import load_config
from heterorl.engines.vllm_engine import VLLMEngine
from heterorl.eventlog import EventLog
from heterorl.live.learner_node import open_learner
from heterorl.live.sampler_node import serve_sampler
from heterorl.loop.worker import SamplerWorker
from heterorl.policy import Policy, SamplingParams, run_process
from heterorl.run.build import build_sampler
from heterorl.run.run_dir import prepare_run_dir
from heterorl.transport.http.service import build_app

from .conftest import PROMPTS, REPO, TOL, G, max_logp_error, reference

pytestmark = pytest.mark.vllm

TOKEN = "vllm-live-token-" + "x" * 24


def test_a_live_vllm_sampler_trains_the_learner_through_the_receiver(trained_dir: Path, tmp_path: Path) -> None:
    cfg = load_config(
        REPO / "configs" / "smoke.yaml",
        [
            "sampler.engine.name=vllm",
            "sampler.engine.chunks_in_flight=2",
            "sampler.interruptible=true",
            "cluster.mode=async",
            "cluster.max_staleness=4",
            "weights.codec=pulse",
            "learner.steps=6",
            "live.fsync=false",
            "live.poll_seconds=0.5",
        ],
    )
    live = open_learner(cfg, prepare_run_dir(cfg, tmp_path / "run"), str(trained_dir), events=EventLog(io.StringIO()))
    live.loop.start()
    sampler = build_sampler(cfg, 0, base=str(trained_dir))
    engine = sampler.engine
    assert isinstance(engine, VLLMEngine)
    worker = SamplerWorker(cfg, 0, sampler)
    trained = []
    train_step = live.loop.learner.train_step

    def spy(groups):
        trained.extend(groups)
        return train_step(groups)

    live.loop.learner.train_step = spy
    trainer = threading.Thread(target=live.train, daemon=True)
    log = io.StringIO()

    async def scenario() -> dict:
        async with TestServer(build_app(live, TOKEN)) as server:
            trainer.start()
            return await asyncio.wait_for(
                serve_sampler(cfg, worker, str(server.make_url("")), TOKEN, EventLog(log)), 300
            )

    try:
        summary = asyncio.run(scenario())
        trainer.join(timeout=60)
        assert live.finished
        assert live.loop.learner.version == 6
        events = [json.loads(line) for line in log.getvalue().splitlines()]
        weights = [e for e in events if e["event"] == "weights"]
        assert all(e["ok"] for e in weights)
        assert any(e["kind"] == "patch" and e["bytes"] > 0 for e in weights)  # PULSE patches decoded from bytes
        assert summary["updates"]["failed"] == 0
        assert summary["updates"]["applied"] == len(weights) >= 2
        assert max(e["running"] for e in events if e["event"] == "generated") >= 2  # chunks shared the batch
        ids = [g.group_id for g in trained]
        assert len(ids) == len(set(ids)) == 6 * cfg.learner.groups_per_step
        assert max(int(g.version_GL.max()) for g in trained) >= 1  # generated with versions the learner published
        # the engine generates with exactly what the receiver holds: its newest verified version, in every layer
        worker.refresh()
        assert engine.version == worker.receiver.version >= 1
        assert engine.last_update["mismatched"] == []
        assert engine.last_update["stale"] == []
        params = SamplingParams.from_config(cfg.sampler)
        ids_KP, mask_KP = Policy.load(trained_dir).encode_prompts(PROMPTS)
        gen = run_process(engine.generate(ids_KP, mask_KP, G, params))
        assert worker.receiver.weights is not None
        held = {name: t.clone() for name, t in worker.receiver.weights.items()}
        assert max_logp_error(reference(trained_dir, held), gen, params) <= TOL
    finally:
        live.request_stop()
        engine.close()
