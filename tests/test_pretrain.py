"""The warm start is a function of its config: it trains with `runtime.threads` whoever calls it (float reductions
split by thread), its cache key includes the thread count, and it records the hash of the weights it made."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import heterorl.pretrain as pretrain_module
from heterorl.config import load_config
from heterorl.policy import Policy
from heterorl.pretrain import base_model_key, pretrain
from heterorl.weights import state_hash

QUICK = [
    "task.name=addition",
    "task.digits=1",
    "pretrain.max_steps=3",
    "pretrain.batch_size=8",
    "sampler.max_new_tokens=3",
]


def test_the_cache_key_includes_the_thread_count() -> None:
    keys = {base_model_key(load_config(None, [*QUICK, f"runtime.threads={t}"])) for t in (1, 2)}
    assert len(keys) == 2


def test_pretraining_uses_the_configured_threads_whoever_calls_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []
    loss = pretrain_module.supervised_loss

    def recording_loss(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return loss(*args, **kwargs)

    monkeypatch.setattr(pretrain_module, "supervised_loss", recording_loss)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # a caller that never called configure_torch (the CLI's pretrain, run --live)
    try:
        result = pretrain(load_config(None, [*QUICK, "runtime.threads=1"]), tmp_path / "base", show_progress=False)
        assert torch.get_num_threads() == 2  # the caller's setting is given back
    finally:
        torch.set_num_threads(before)
    assert seen == [1, 1, 1]
    assert result.threads == 1
    weights = dict(Policy.load(tmp_path / "base").model.named_parameters())
    assert result.state_hash == state_hash(weights)  # pretrain.json says which base model this is
