"""The vLLM engine's generation against heterorl's teacher forcing, on the tier's shared engine (`make test-vllm`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from heterorl.engines.base import EngineError
from heterorl.engines.vllm_engine import VLLMEngine, request_seed
from heterorl.policy import Generation, Policy, SamplingParams, run_process

from .conftest import FIRST, PROMPTS, TOL, G, max_logp_error, perturbed, reference, start_engine

pytestmark = pytest.mark.vllm


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


def single_request(engine: VLLMEngine, prompt: list[int], params: SamplingParams, seed: int) -> tuple[list, list]:
    """(tokens, log-probs) of one vLLM request with n = 1 and `seed`, alone in the engine's batch."""
    request_id = f"single-{seed}"
    engine._engine.add_request(request_id, {"prompt_token_ids": prompt}, engine._vllm_params(params, 1, 8, seed))
    tokens: list[int] = []
    logps: list[float] = []
    while True:
        for out in engine._engine.step():
            assert out.request_id == request_id
            for c in out.outputs:
                tokens += c.token_ids
                logps += [entry[t].logprob for entry, t in zip(c.logprobs, c.token_ids, strict=True)]
            if out.finished:
                return tokens, logps


def test_one_request_per_prompt_samples_what_g_seeded_requests_sample(at_base: VLLMEngine, trained_dir: Path) -> None:
    """A prompt's G completions are one vLLM request with n = G, and completion i is exactly what a request of its
    own seeded s + i samples alone (vLLM gives child i the seed s + i): each completion's randomness is its own,
    whatever it is batched with."""
    ids, mask = Policy.load(trained_dir).encode_prompts(PROMPTS[:2])
    job = at_base.submit(ids, mask, G, FIRST)
    requests = [seq.request_id for seq in job.sequences]
    assert requests == [requests[0]] * G + [requests[G]] * G  # one request per prompt
    assert requests[0] != requests[G]
    while not job.done:
        at_base.step()
    gen = at_base.result(job)
    for k, request_id in enumerate((requests[0], requests[G])):
        seed = request_seed(at_base.seed, int(str(request_id).rpartition("-r")[2]))
        prompt = ids[k][mask[k].bool()].tolist()
        for i in range(G):
            tokens, logps = single_request(at_base, prompt, FIRST, seed + i)
            row = k * G + i
            n = int(gen.completion_mask_NL[row].sum())
            assert gen.completion_ids_NL[row, :n].tolist() == tokens
            assert torch.equal(gen.logp_NL[row, :n], torch.tensor(logps, dtype=torch.float32))


def test_the_same_seed_samples_the_same(
    started: tuple[VLLMEngine, Generation], trained_dir: Path, base: dict[str, torch.Tensor]
) -> None:
    """Reproducibility: a second engine with the same seed, given the same calls, samples the same completions
    with the same log-probs, bit for bit."""
    other, again = start_engine(trained_dir, base, seed=0)
    other.close()
    first = started[1]
    for name in ("completion_ids_NL", "completion_mask_NL", "logp_NL", "version_NL"):
        assert torch.equal(getattr(again, name), getattr(first, name)), name
    assert len({tuple(r) for r in first.completion_ids_NL.tolist()}) > 1


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


def test_bad_params_are_clear_errors(at_base: VLLMEngine) -> None:
    ids = torch.tensor([[5, 6]])
    with pytest.raises(EngineError, match="greedy"):
        at_base.generate(ids, torch.ones_like(ids), 2, SamplingParams(greedy=True))
    with pytest.raises(EngineError, match="logit_noise"):
        at_base.generate(ids, torch.ones_like(ids), 2, SamplingParams(logit_noise=0.1))
    with pytest.raises(EngineError, match="empty prompt"):
        at_base.generate(ids, torch.zeros_like(ids), 2, SamplingParams())
    with pytest.raises(EngineError, match="group size"):
        at_base.generate(ids, torch.ones_like(ids), 1 << 16, SamplingParams())
