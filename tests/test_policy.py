from pathlib import Path

import pytest
import torch

from heterorl.policy import Policy, SamplingParams, _backend_encoder, filter_logits, run_process

PROMPTS = ["1+2=", "123+45=", "9=", "55+55=", "7+70="]  # unequal lengths: left padding in the batch


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> Policy:
    p = Policy.load(tiny_model_dir)
    p.model.eval()
    return p


def _generate(policy: Policy, params: SamplingParams, seed: int = 0):
    ids, mask = policy.encode_prompts(PROMPTS)
    ids, mask = ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0)
    return policy.generate(ids, mask, params, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, max_new_tokens=10),
        SamplingParams(temperature=0.6, max_new_tokens=10),
        SamplingParams(temperature=1.3, top_k=7, max_new_tokens=10),
        SamplingParams(temperature=0.9, top_p=0.7, max_new_tokens=10),
        SamplingParams(temperature=0.8, top_k=10, top_p=0.9, max_new_tokens=10),
    ],
    ids=["t1", "t0.6", "topk", "topp", "topk+topp"],
)
def test_generation_logprobs_equal_teacher_forced_logprobs(policy: Policy, params: SamplingParams) -> None:
    gen = _generate(policy, params)
    lengths = gen.completion_mask_NL.sum(1)
    assert lengths.min() < lengths.max() or gen.completion_ids_NL.shape[1] == 10  # padding is exercised
    with torch.no_grad():
        tf = policy.token_logprobs(
            gen.prompt_ids_NP, gen.prompt_mask_NP, gen.completion_ids_NL, gen.completion_mask_NL, params
        )
    assert torch.allclose(tf, gen.logp_NL, atol=1e-5, rtol=0)
    assert (gen.logp_NL[gen.completion_mask_NL.bool()] <= 0).all()


def test_masks_exclude_prompt_and_padding(policy: Policy) -> None:
    gen = _generate(policy, SamplingParams(max_new_tokens=10))
    mask = gen.completion_mask_NL.bool()
    for row in range(mask.shape[0]):
        n = int(mask[row].sum())
        assert mask[row, :n].all()
        assert not mask[row, n:].any()
        ids = gen.completion_ids_NL[row]
        if n < ids.shape[0]:
            assert ids[n - 1] == policy.eos_id  # stopped by end-of-sequence
            assert (ids[n:] == policy.pad_id).all()
    assert (gen.logp_NL[~mask] == 0).all()
    # the prompt mask marks exactly the real prompt characters
    assert gen.prompt_mask_NP.sum(1).tolist() == [len(p) for p in PROMPTS for _ in range(3)]


def test_padding_does_not_change_a_sequence_s_logprobs(policy: Policy) -> None:
    params = SamplingParams(max_new_tokens=8)
    gen = _generate(policy, params)
    row = 2 * 3  # the shortest prompt "9=", heavily left-padded in the batch
    alone_ids, alone_mask = policy.encode_prompts([PROMPTS[2]])
    with torch.no_grad():
        alone = policy.token_logprobs(
            alone_ids, alone_mask, gen.completion_ids_NL[row : row + 1], gen.completion_mask_NL[row : row + 1], params
        )
    assert torch.allclose(alone[0], gen.logp_NL[row], atol=1e-5, rtol=0)


def test_sampling_is_seeded(policy: Policy) -> None:
    a = _generate(policy, SamplingParams(max_new_tokens=6), seed=3)
    b = _generate(policy, SamplingParams(max_new_tokens=6), seed=3)
    assert torch.equal(a.completion_ids_NL, b.completion_ids_NL)


def test_greedy_decoding_is_the_argmax(policy: Policy) -> None:
    gen = _generate(policy, SamplingParams(max_new_tokens=6, greedy=True))
    with torch.no_grad():
        ids = torch.cat([gen.prompt_ids_NP, gen.completion_ids_NL], 1)
        att = torch.cat([gen.prompt_mask_NP, gen.completion_mask_NL], 1)
        logits = policy.model(input_ids=ids, attention_mask=att, position_ids=(att.cumsum(-1) - 1).clamp(min=0)).logits
    P = gen.prompt_ids_NP.shape[1]
    argmax = logits[:, P - 1 : -1].argmax(-1)
    mask = gen.completion_mask_NL.bool()
    assert torch.equal(argmax[mask], gen.completion_ids_NL[mask])


def test_filter_logits_top_k_and_top_p() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    kept = filter_logits(logits, SamplingParams(top_k=2)).exp()
    assert torch.allclose(kept, torch.tensor([[2 / 3, 1 / 3, 0.0, 0.0]]))
    kept = filter_logits(logits, SamplingParams(top_p=0.8)).exp()  # 0.5 + 0.25 < 0.8 -> keep the third too
    assert torch.allclose(kept, torch.tensor([[0.5, 0.25, 0.15, 0.0]]) / 0.9)
    kept = filter_logits(logits, SamplingParams(top_p=0.1)).exp()  # always keeps the most likely token
    assert torch.allclose(kept, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    kept = filter_logits(logits, SamplingParams(temperature=2.0)).exp()
    expected = torch.tensor([0.5, 0.25, 0.15, 0.1]).sqrt()
    assert torch.allclose(kept[0], expected / expected.sum())


def test_interrupted_generation_tags_and_scores_each_token_with_its_weights(tiny_model_dir: Path) -> None:
    """AReaL's interruptible rollout: weights swapped after token 2 apply to tokens 3.. only."""
    old, new = Policy.load(tiny_model_dir), Policy.load(tiny_model_dir)
    with torch.no_grad():
        for p in new.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    live = Policy.load(tiny_model_dir)
    version = {"v": 0}
    params = SamplingParams(max_new_tokens=8, temperature=1.5)
    ids, mask = live.encode_prompts(PROMPTS)
    process = live.iter_generate(ids, mask, params, torch.Generator().manual_seed(1), lambda: version["v"])
    next(process)  # one token sampled
    next(process)  # two tokens sampled
    live.model.load_state_dict(new.model.state_dict())
    version["v"] = 1
    gen = run_process(process)
    mask_NL = gen.completion_mask_NL.bool()
    assert (gen.version_NL[:, :2] == 0).all()
    assert (gen.version_NL[:, 2:][mask_NL[:, 2:]] == 1).all()
    with torch.no_grad():
        lp_old = old.token_logprobs(ids, mask, gen.completion_ids_NL, gen.completion_mask_NL, params)
        lp_new = new.token_logprobs(ids, mask, gen.completion_ids_NL, gen.completion_mask_NL, params)
    expected = torch.where(gen.version_NL == 0, lp_old, lp_new)
    assert torch.allclose(gen.logp_NL, expected, atol=1e-5, rtol=0)


def test_missing_model_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a transformers checkpoint"):
        Policy.load(tmp_path / "nowhere")


def test_checkpoint_is_loadable_by_transformers(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert (tiny_model_dir / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert model.config.vocab_size == len(tok)


def test_repeated_prompts_encoded_once_generate_the_same_bits(policy: Policy) -> None:
    """`repeats`: a group's prompt is encoded once and its KV cache repeated; every row then sees exactly the cache
    it would have computed alone, so the completions, log-probs and versions are bit-identical."""
    ids, mask = policy.encode_prompts(PROMPTS)
    params = SamplingParams(temperature=1.1, top_k=12, max_new_tokens=8)
    expected = _generate(policy, params, seed=3)
    process = policy.iter_generate(ids, mask, params, torch.Generator().manual_seed(3), lambda: 0, repeats=3)
    got = run_process(process)
    for name in ("prompt_ids_NP", "prompt_mask_NP", "completion_ids_NL", "completion_mask_NL", "logp_NL", "version_NL"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name


def test_encode_prompts_matches_the_tokenizer_and_caches_prompt_ids(policy: Policy) -> None:
    ids, mask = policy.encode_prompts(PROMPTS)
    enc = policy.tokenizer(PROMPTS, padding=True, add_special_tokens=False, return_tensors="pt")
    assert torch.equal(ids, enc["input_ids"])
    assert torch.equal(mask, enc["attention_mask"])
    first = policy.text.prompt_ids(PROMPTS[1])
    first.append(-1)  # a copy: the cached ids cannot be altered by a caller
    assert policy.text.prompt_ids(PROMPTS[1]) == enc["input_ids"][1][enc["attention_mask"][1].bool()].tolist()


TEXTS = ["1+2=", "", " ", "  12 + 3 =\n", "99+01=", "ab\tcd", "é+ü=", "<|im_start|>user\n3+4=<|im_end|>", "x" * 300]


@pytest.mark.parametrize("which", ["characters", "bpe"])
def test_prompt_ids_are_the_transformers_tokenizer_s_ids(which: str, tiny_model_dir: Path, qwen_dir: Path) -> None:
    """The Rust encoder's ids are `tokenizer(text, add_special_tokens=False)`'s for the character tokenizer and a
    byte-level BPE with a chat template (special tokens, whitespace, non-ASCII, long texts, the template's text);
    a backend saved with truncation falls back to the transformers call (which switches it off)."""
    tok = Policy.load(tiny_model_dir if which == "characters" else qwen_dir).tokenizer
    encode = _backend_encoder(tok)
    texts = [*TEXTS]
    if which == "bpe":
        chat = [{"role": "user", "content": "What is 3+4?"}]
        texts.append(tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
    for text in texts:
        assert encode(text) == list(tok(text, add_special_tokens=False)["input_ids"]), repr(text)
    tok.backend_tokenizer.enable_truncation(max_length=2)
    truncating = _backend_encoder(tok)
    assert truncating(texts[-1]) == list(tok(texts[-1], add_special_tokens=False)["input_ids"])
    assert len(truncating(texts[-1])) > 2


def test_decode_completions_is_the_tokenizers_decode_cached_by_exact_ids() -> None:
    """Texts come from the tokenizer the first time and from the cache after, the same either way: a row's ids
    without eos and masked-off positions, each row by its own ids (rows that differ in one id or in length never
    share a text), and rows longer than TEXT_CACHE_TOKENS decoded every time."""
    from heterorl.policy import TEXT_CACHE_TOKENS, TextFormat
    from heterorl.tokenizer import build_char_tokenizer

    text = TextFormat(build_char_tokenizer())
    tok, eos = text.tokenizer, text.eos_id
    rows = [tok("12", add_special_tokens=False)["input_ids"], tok("123", add_special_tokens=False)["input_ids"]]
    rows += [tok("13", add_special_tokens=False)["input_ids"], tok("9" * (TEXT_CACHE_TOKENS + 3))["input_ids"]]
    L = max(len(r) for r in rows) + 2
    ids = torch.full((len(rows) + 1, L), text.pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate([*rows, rows[0]]):
        ids[i, : len(r) + 1] = torch.tensor([*r, eos])
        mask[i, : len(r) + 1] = 1
    mask[2, 0] = 0  # a masked-off id is not part of the text
    want = ["12", "123", "3", "9" * (TEXT_CACHE_TOKENS + 3), "12"]
    assert text.decode_completions(ids, mask) == want
    assert text.decode_completions(ids, mask) == want  # now from the cache
    assert tuple(rows[3]) not in text._texts  # too long to keep
    mask[2, 0] = 1
    assert text.decode_completions(ids, mask)[2] == "13"  # other ids, another text


def test_generation_under_inference_mode_is_the_no_grad_one_bit_for_bit(policy: Policy, monkeypatch) -> None:
    """The decode loop's forwards run under inference mode: the same floats as under no_grad (the reference, with
    inference mode swapped for no_grad), repeated prompts and a weight swap mid-generation included, and tensors
    callers may edit in place (adversaries and frictions do)."""
    ids, mask = policy.encode_prompts(PROMPTS)
    params = SamplingParams(temperature=1.1, top_k=12, max_new_tokens=8)
    weights = {n: p.detach().clone() for n, p in policy.model.named_parameters()}

    def run():
        version = [0]
        process = policy.iter_generate(ids, mask, params, torch.Generator().manual_seed(5), lambda: version[0], 3)
        next(process)
        next(process)
        with torch.no_grad():  # a swap to other weights between steps: the cache is rebuilt under them
            for p in policy.model.parameters():
                p.mul_(1.01)
        version[0] = 1
        try:
            return run_process(process)
        finally:
            with torch.no_grad():
                for n, p in policy.model.named_parameters():
                    p.copy_(weights[n])

    got = run()
    monkeypatch.setattr(torch, "inference_mode", torch.no_grad)
    want = run()
    for name in ("completion_ids_NL", "completion_mask_NL", "logp_NL", "version_NL"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
        assert not getattr(got, name).is_inference(), name
    assert got.version_NL.max() == 1
    got.logp_NL[0, 0] = 0.0  # editable in place outside inference mode
