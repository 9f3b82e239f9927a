"""A short RL run whose sampler generates with vLLM (real generation, real optimizer steps) improves reward."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import capture_records
from heterorl.config import load_config
from heterorl.engines.vllm_engine import VLLMEngine
from heterorl.simulated.run import build_simulated

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
def test_rl_with_the_vllm_sampler_improves_reward(trained_dir: Path, overrides: list[str], tmp_path: Path) -> None:
    cfg = load_config(REPO / "configs" / "smoke.yaml", ["sampler.engine.name=vllm", *overrides])
    cluster = build_simulated(cfg, tmp_path, str(trained_dir))  # the run's own builder picks the vLLM engine
    assert all(isinstance(n.worker.sampler.engine, VLLMEngine) for n in cluster.nodes)
    records = capture_records(cluster)
    try:
        cluster.run()
    finally:
        cluster.loop.publisher.close()
        cluster.close()
    rewards = [r["reward/mean"] for r in records]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"reward first 5 steps {first:.3f} -> last 5 {last:.3f} ({overrides or 'sync'})")
    assert len(records) == cfg.learner.steps
    assert last > first + 0.03
    assert max(r["stale/max"] for r in records) >= (1 if "cluster.mode=async" in overrides else 0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_group_of_an_honest_vllm_sampler_passes_the_verifier(trained_dir: Path, tmp_path: Path, dtype: str):
    """The false-positive check for vLLM samplers: every group (`trust.verify.fraction: 1`) of an asynchronous
    run is re-scored by the learner's one teacher-forced pass under the version it claims, in the samplers' dtype,
    and none fails the calibrated vLLM tolerances (`loop/screen.py`), nor is any sampler quarantined."""
    overrides = [
        "sampler.engine.name=vllm",
        f"model.dtype={dtype}",
        "trust.verify.fraction=1.0",
        "cluster.mode=async",
        "cluster.max_staleness=4",
        "weights.codec=pulse",
        "learner.steps=12",
    ]
    cfg = load_config(REPO / "configs" / "smoke.yaml", overrides)
    cluster = build_simulated(cfg, tmp_path, str(trained_dir))
    try:
        cluster.run()
    finally:
        cluster.loop.publisher.close()
        cluster.close()
    records = cluster.loop.trust.to_json()
    verified = sum(r["verified"] for r in records.values())
    failed = {name: (r["failed"], dict(r["refused"])) for name, r in records.items() if r["failed"]}
    print(f"vLLM {dtype}: {verified} groups verified, failed {failed or 0}")
    assert verified >= cfg.learner.steps * cfg.learner.groups_per_step
    assert not failed
    assert all(r["quarantined_at"] is None for r in records.values())
