"""The vLLM engine's parts that need no vLLM: request bookkeeping, LoRA merging, config, the install hint."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from heterorl.config import VLLMEngineConfig, load_config
from heterorl.engines.base import EngineError
from heterorl.engines.lora_merge import AdapterMerger, split_adapter_name
from heterorl.engines.vllm_jobs import Sequence, make_job, sampled_logprobs
from heterorl.lora import adapter_state, apply_lora
from heterorl.policy import Policy, SamplingParams, filter_logits

EOS = 1


def test_job_assembles_a_prompt_major_generation_with_per_token_versions() -> None:
    prompts = torch.tensor([[0, 5, 6], [7, 8, 9]])  # left-padded with 0
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    job = make_job(3, prompts, mask, group_size=2, max_tokens=4)
    assert [s.prompt for s in job.sequences] == [[5, 6], [5, 6], [7, 8, 9], [7, 8, 9]]
    a, b, c, d = job.sequences
    a.segment_version = 0
    a.extend([4, 4], [-0.5, -0.25], EOS)
    a.segment_version = 2  # an update arrived: the rest comes from version 2, from the prefix so far
    assert a.context() == [5, 6, 4, 4]
    assert a.remaining == 2
    a.extend([EOS], [-1.0], EOS)
    b.extend([EOS], [0.0], EOS)
    c.extend([4, 4, 4, 4], [-0.1] * 4, EOS)  # the length limit
    assert not job.done
    d.extend([4, 4], [-2.0, 5e-7], EOS)  # a log-prob rounded just above 0 is 0
    d.extend([4, 4], [-2.0, -2.0], EOS)
    assert job.done
    assert job.tokens == 3 + 1 + 4 + 4
    gen = job.generation(pad_id=0)
    assert torch.equal(gen.prompt_ids_NP, prompts.repeat_interleave(2, 0))
    assert gen.completion_ids_NL.tolist()[0] == [4, 4, EOS, 0]
    assert gen.completion_mask_NL.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]]
    assert gen.version_NL.tolist()[0] == [0, 0, 2, 0]
    assert gen.logp_NL.tolist()[0] == [-0.5, -0.25, -1.0, 0.0]
    assert gen.logp_NL[3, 1].item() == 0.0


def test_sequence_rejects_what_vllm_must_never_return() -> None:
    seq = Sequence([5], max_tokens=2)
    with pytest.raises(ValueError, match="not <= 0"):
        seq.extend([4], [0.5], EOS)
    with pytest.raises(ValueError, match="not <= 0"):
        seq.extend([4], [float("nan")], EOS)
    with pytest.raises(ValueError, match="2 tokens but 1"):
        seq.extend([4, 4], [-1.0], EOS)
    seq.extend([EOS], [-1.0], EOS)
    with pytest.raises(ValueError, match="after the end"):
        seq.extend([4], [-1.0], EOS)
    with pytest.raises(ValueError, match="empty prompt"):
        make_job(0, torch.tensor([[3, 4]]), torch.tensor([[0, 0]]), 2, 4)


def test_adapter_names() -> None:
    assert split_adapter_name("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight") == (
        "model.layers.0.self_attn.q_proj",
        "A",
    )
    for bad in ("model.layers.0.q_proj.weight", "base_model.model.x.lora_C.default.weight"):
        with pytest.raises(ValueError, match="not a PEFT LoRA adapter tensor name"):
            split_adapter_name(bad)


def test_merged_adapter_equals_the_peft_model(tiny_model_dir: Path) -> None:
    """Base + merged adapter (a plain model, as vLLM runs it) computes what the PEFT model computes."""
    cfg = load_config(None, ["model.lora={rank: 4, alpha: 8, target_modules: [q_proj, v_proj, down_proj]}"])
    peft_policy = Policy.load(tiny_model_dir)
    peft_policy.model = apply_lora(peft_policy.model, cfg.model.lora)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in adapter_state(peft_policy.model).values():
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    adapter = {n: p.detach().to(torch.bfloat16) for n, p in adapter_state(peft_policy.model).items()}
    with torch.no_grad():  # the PEFT model computes with the bf16 adapter a sampler receives
        for name, p in adapter_state(peft_policy.model).items():
            p.copy_(adapter[name].float())
    merger = AdapterMerger(tiny_model_dir, ["q_proj", "v_proj", "down_proj"], rank=4, alpha=8)
    merged = merger.merge(adapter)
    assert sorted(merged) == [f"{m}.weight" for m in merger.modules]
    assert len(merged) == 3  # one layer: q, v, down
    plain = Policy.load(tiny_model_dir)
    plain.model.load_state_dict(merged, strict=False)
    ids, mask = plain.encode_prompts(["1+2=", "3+4="])
    with torch.no_grad():
        want = peft_policy.model(input_ids=ids, attention_mask=mask).logits
        got = plain.model(input_ids=ids, attention_mask=mask).logits
        base = Policy.load(tiny_model_dir).model(input_ids=ids, attention_mask=mask).logits
    assert float((want - got).abs().max()) < 1e-5
    assert float((want - base).abs().max()) > 1e-3
    with pytest.raises(ValueError, match="lacks lora_A or lora_B"):
        merger.merge({k: v for k, v in adapter.items() if "v_proj.lora_B" not in k})
    with pytest.raises(ValueError, match="do not fit"):
        merger.merge({k: (v[:2] if "q_proj.lora_A" in k else v) for k, v in adapter.items()})


def test_vllm_config_section() -> None:
    cfg = load_config(
        None, ["sampler.engine.name=vllm", "sampler.engine.kv_cache_gib=2", "sampler.engine.max_model_len=512"]
    )
    assert isinstance(cfg.sampler.engine, VLLMEngineConfig)
    assert (cfg.sampler.engine.kv_cache_gib, cfg.sampler.engine.max_model_len) == (2.0, 512)
    with pytest.raises(Exception, match="kv_cache_gib"):
        load_config(None, ["sampler.engine.name=vllm", "sampler.engine.kv_cache_gib=0"])


def test_missing_vllm_says_make_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    from heterorl.engines.vllm_setup import import_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError, installed or not
    with pytest.raises(EngineError, match=r"vLLM cannot be imported .*make vllm"):
        import_vllm()


def test_scored_logprobs_are_rebuilt_under_the_sampling_distribution() -> None:
    """`score`'s rebuild: full-vocabulary log-softmax entries (as vLLM's prompt log-probs) -> the log-prob of each
    completion token after temperature and top-k, equal to heterorl's own filter on the same logits."""
    logits_LV = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 1.5, 1.0]])
    logsoftmax = logits_LV.log_softmax(-1)
    entries = [{tok: SimpleNamespace(logprob=float(v)) for tok, v in enumerate(row)} for row in logsoftmax]
    params = SamplingParams(temperature=0.5, top_k=2)
    got = sampled_logprobs(entries, [1, 3], vocab=4, params=params)
    want = filter_logits(logits_LV, params).gather(-1, torch.tensor([[1], [3]])).squeeze(-1)
    assert torch.allclose(got, want, atol=1e-6)
    assert got[0] == pytest.approx(float(torch.tensor([4.0, 2.0]).log_softmax(-1)[1]), abs=1e-6)  # T = 0.5, top 2
    assert got[1] == float("-inf")  # token 3 is outside the top 2
