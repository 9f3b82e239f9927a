"""LoRA checkpoints that other tools can load, and activation checkpointing through transformers' current API."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from heterorl.learner import Learner
from heterorl.policy import Policy, SamplingParams
from heterorl.sampler import Sampler
from heterorl.tasks import make_task


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # inside peft's loader
def test_the_saved_adapter_names_its_base_absolutely_and_loads_anywhere(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    peft = pytest.importorskip("peft")
    work = tmp_path / "work"
    shutil.copytree(tiny_model_dir, work / "base")
    monkeypatch.chdir(work)  # model.path relative, as users write it
    cfg = tiny_config(Path("base"), "model.lora={rank: 4, alpha: 8}")
    learner = Learner(Policy.load("base"), cfg)
    with torch.no_grad():  # move the adapters off their zero start, so the check below has something to compare
        for name, p in learner.policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    learner.save_checkpoint("run/checkpoint")
    adapter = work / "run" / "checkpoint" / "adapter"
    saved = json.loads((adapter / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str(work / "base")
    assert saved["task_type"] == "CAUSAL_LM"

    monkeypatch.chdir(tmp_path)  # elsewhere: a relative base path would no longer resolve
    loaded = peft.AutoPeftModelForCausalLM.from_pretrained(str(adapter))
    merged = Policy.load(work / "run" / "checkpoint").model
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    with torch.no_grad():
        assert torch.allclose(loaded(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-5)


def _groups(model_dir: Path, n: int):
    """Rollout groups of the plain model with unequal rewards (so the gradient is not zero)."""
    cfg = tiny_config(model_dir)
    sampler = Sampler.from_policy(
        "s", Policy.load(model_dir), make_task(cfg.task), SamplingParams.from_config(cfg.sampler), 4, 0
    )
    sampler.load_weights(0, {k: v.detach().bfloat16() for k, v in Policy.load(model_dir).model.named_parameters()})
    groups = sampler.generate_groups(n)
    for g in groups:
        g.rewards_G = torch.tensor([1.0, 0.0, 0.0, 1.0])
    return groups


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_activation_checkpointing_without_deprecation_warnings(tiny_model_dir: Path, lora: bool) -> None:
    extra = ["model.lora={rank: 4}"] if lora else []
    plain_cfg = tiny_config(tiny_model_dir, *extra)
    ckpt_cfg = tiny_config(tiny_model_dir, *extra, "learner.gradient_checkpointing=true")
    torch.manual_seed(0)
    plain = Learner(Policy.load(tiny_model_dir), plain_cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # transformers' deprecations are FutureWarnings
        torch.manual_seed(0)
        ckpt = Learner(Policy.load(tiny_model_dir), ckpt_cfg)
    base = ckpt.policy.model.get_base_model() if lora else ckpt.policy.model
    assert base.is_activation_checkpointing
    groups = _groups(tiny_model_dir, 4)
    a = plain.train_step(groups)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        b = ckpt.train_step(groups)
    assert b["obj/loss"] == pytest.approx(a["obj/loss"], abs=1e-6)
    assert b["opt/grad_norm"] == pytest.approx(a["opt/grad_norm"], rel=1e-4)
