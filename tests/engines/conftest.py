"""Shared pieces of the engine tests: a trained base model (the smoke warm start) and its reference policy.

The vLLM tier (`-m vllm`, `make test-vllm`) needs vLLM: a missing vLLM there is a failure with the install hint,
never a skip. Every test module of the tier starts one engine and shares it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from heterorl.config import load_config
from heterorl.policy import Policy
from heterorl.pretrain import pretrain

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def trained_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke config's warm-started base model (character tokenizer, peaked distributions: top-k is meaningful
    on it, where a random model's near-uniform logits tie)."""
    out = tmp_path_factory.mktemp("smoke-base")
    pretrain(load_config(REPO / "configs" / "smoke.yaml", []), out, show_progress=False)
    return out


def bf16_state(policy: Policy) -> dict[str, torch.Tensor]:
    """What a learner publishes: every parameter in bf16 under its Hugging Face name (tied weights once)."""
    return {name: p.detach().to(torch.bfloat16).clone() for name, p in policy.model.named_parameters()}


def reference(path: Path, weights: dict[str, torch.Tensor]) -> Policy:
    """The fp32 teacher-forcing reference holding exactly `weights` (bf16 values, computed in fp32)."""
    policy = Policy.load(path)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            p.copy_(weights[name].float())
    policy.model.eval()
    return policy


def perturbed(weights: dict[str, torch.Tensor], scale: float, seed: int) -> dict[str, torch.Tensor]:
    """Every tensor moved by relative noise (what a few learner steps do, in every layer)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        name: (w.float() * (1 + scale * torch.randn(w.shape, generator=gen))).to(w.dtype) for name, w in weights.items()
    }
