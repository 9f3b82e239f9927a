"""SamplerWorker: its receiver decodes updates with `weights.codec_threads` threads under both clocks (a live
sampler's worker builds its own receiver; the simulator hands each worker a `SharedReceiver`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import heterorl.weights.store as store_module
from conftest import tiny_config
from heterorl.loop.worker import SamplerWorker
from heterorl.policy import Policy, SamplingParams
from heterorl.sampler import Sampler
from heterorl.simulated.run import build_simulated
from heterorl.simulated.shared_weights import SharedReceiver
from heterorl.tasks import make_task
from heterorl.weights import WeightStore


@pytest.mark.parametrize("clock", ["live", "simulated"])
def test_updates_decode_with_codec_threads(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: str
) -> None:
    cfg = tiny_config(tiny_model_dir, "weights.codec=pulse", "weights.codec_threads=3")
    policy = Policy.load(tiny_model_dir)
    if clock == "live":
        params = SamplingParams.from_config(cfg.sampler)
        sampler = Sampler.from_policy("sampler-0", policy, make_task(cfg.task), params, cfg.sampler.group_size, 0)
        worker = SamplerWorker(cfg, 0, sampler)
    else:
        cluster = build_simulated(cfg, tmp_path, str(tiny_model_dir))
        cluster.close()
        worker = cluster.nodes[0].worker
        assert isinstance(worker.receiver, SharedReceiver)
    threads: list[int] = []
    apply_patch = store_module.apply_patch

    def spy(weights, patch, workers=1):
        threads.append(workers)
        return apply_patch(weights, patch, workers=workers)

    monkeypatch.setattr(store_module, "apply_patch", spy)
    store = WeightStore.from_config(cfg.weights)
    first = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    gen = torch.Generator().manual_seed(0)
    second = {  # a few elements change (a patch is smaller than a snapshot)
        n: torch.where(torch.rand(w.shape, generator=gen) < 0.05, w + 0.1, w) for n, w in first.items()
    }
    store.publish(0, first)
    assert worker.receive(store.update_for(*worker.held()))  # a snapshot
    store.publish(1, second)
    update = store.update_for(*worker.held())
    assert update.kind == "patch"
    assert worker.receive(update)
    assert threads == [3]
    assert worker.receiver.weights is not None
    for name, w in second.items():
        assert torch.equal(worker.receiver.weights[name], w.to(torch.bfloat16))
