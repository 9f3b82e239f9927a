"""A short RL run whose sampler generates with vLLM (real generation, real optimizer steps) improves reward."""

from __future__ import annotations

from pathlib import Path

import pytest

from heterorl.cluster.simulated import SimulatedCluster
from heterorl.config import load_config
from heterorl.engines.vllm_engine import VLLMEngine
from heterorl.policy import Policy, SamplingParams
from heterorl.run import make_learner, sampler_seed
from heterorl.sampler import Sampler
from heterorl.tasks import make_task

from .conftest import REPO

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # the smoke run as it ships: synchronous, full snapshots
        ["cluster.mode=async", "sampler.interruptible=true", "weights.codec=pulse", "cluster.max_staleness=4"],
    ],
    ids=["sync", "async-interruptible-pulse"],
)
def test_rl_with_the_vllm_sampler_improves_reward(trained_dir: Path, overrides: list[str]) -> None:
    cfg = load_config(REPO / "configs" / "smoke.yaml", ["sampler.engine.name=vllm", *overrides])
    base = str(trained_dir)
    task = make_task(cfg.task)
    learner = make_learner(cfg, base)
    engine = VLLMEngine.from_config(cfg, base, seed=sampler_seed(cfg.seed, 0))
    try:
        text = Policy.load(base).text
        sampler = Sampler(
            "vllm-0", engine, text, task, SamplingParams.from_config(cfg.sampler), cfg.sampler.group_size, seed=1
        )
        records: list[dict] = []
        cluster = SimulatedCluster(cfg, learner, [sampler], records.append)
        cluster.run()
    finally:
        engine.close()
    rewards = [r["reward/mean"] for r in records]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"reward first 5 steps {first:.3f} -> last 5 {last:.3f} ({overrides or 'sync'})")
    assert len(records) == cfg.learner.steps
    assert last > first + 0.03
    assert max(r["stale/max"] for r in records) >= (1 if "cluster.mode=async" in overrides else 0)
