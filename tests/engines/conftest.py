"""Shared pieces of the engine tests: a trained base model (the smoke warm start), its reference policy, and the
vLLM engine the tier shares.

The vLLM tier (`-m vllm`, `make test-vllm`) needs vLLM: a missing vLLM there is a failure with the install hint,
never a skip. The tier's engine tests share one engine (a session fixture: vLLM takes ~20-40 s to start on CPU);
a test that changes its weights restores them through `at_base`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from heterorl.config import VLLMEngineConfig, load_config
from heterorl.policy import Generation, Policy, SamplingParams, run_process
from heterorl.pretrain import pretrain

if TYPE_CHECKING:
    from heterorl.engines.vllm_engine import VLLMEngine

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ["abca=", "dcb=", "bbad=", "cabdc="]  # the smoke task: reverse the letters
G = 4
TOL = 1e-4
FIRST = SamplingParams(temperature=1.0, max_new_tokens=8)  # what a fresh engine generates first


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


def max_logp_error(ref: Policy, gen: Generation, params: SamplingParams) -> float:
    """Largest |behaviour log-prob - teacher-forced log-prob| over the generated tokens."""
    with torch.no_grad():
        tf = ref.token_logprobs(
            gen.prompt_ids_NP, gen.prompt_mask_NP, gen.completion_ids_NL, gen.completion_mask_NL, params
        )
    mask = gen.completion_mask_NL.bool()
    return float((tf - gen.logp_NL).abs()[mask].max())


def start_engine(path: Path, base: dict[str, torch.Tensor], seed: int) -> tuple[VLLMEngine, Generation]:
    """A vLLM engine seeded `seed` holding `base` as version 0, and its first generation (PROMPTS, G, FIRST)."""
    from heterorl.engines.vllm_engine import VLLMEngine

    policy = Policy.load(path)
    engine = VLLMEngine(path, VLLMEngineConfig(max_num_seqs=64), eos_id=policy.eos_id, pad_id=policy.pad_id, seed=seed)
    engine.load_weights(0, base)
    ids, mask = policy.encode_prompts(PROMPTS)
    return engine, run_process(engine.generate(ids, mask, G, FIRST))


@pytest.fixture(scope="session")
def base(trained_dir: Path) -> dict[str, torch.Tensor]:
    return bf16_state(Policy.load(trained_dir))


@pytest.fixture(scope="session")
def started(trained_dir: Path, base: dict[str, torch.Tensor]) -> Iterator[tuple[VLLMEngine, Generation]]:
    """The tier's shared engine (seed 0) and the first generation it made."""
    engine, first = start_engine(trained_dir, base, seed=0)
    yield engine, first
    engine.close()


@pytest.fixture
def at_base(started: tuple[VLLMEngine, Generation], base: dict[str, torch.Tensor]) -> VLLMEngine:
    """The shared engine holding the base weights as version 0 (tests that update it restore it here)."""
    engine = started[0]
    if engine.version != 0:
        engine.load_weights(0, base)
    return engine
