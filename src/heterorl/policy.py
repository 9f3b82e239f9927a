"""A causal LM from transformers plus its tokenizer: sample with per-token log-probs, score given tokens.

Layout used everywhere: prompts are LEFT-padded to a common length P, completions follow, RIGHT-padded to L.
Position ids are `cumsum(attention_mask) - 1`, so a padded sequence sees exactly the positions it would see
alone; this is what makes generation log-probs equal teacher-forced log-probs of the same tokens.

All log-probs are of the distribution actually sampled from: logits / temperature, then top-k and top-p
filtering, then log-softmax (`filter_logits`, shared by both paths).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as transformers_logging

from heterorl.config import ModelConfig, SamplerConfig
from heterorl.errors import PathNotFoundError
from heterorl.tokenizer import build_char_tokenizer

T = TypeVar("T")
PROMPT_CACHE = 65_536  # prompts whose ids a TextFormat keeps (a few hundred bytes each)
TEXT_CACHE = 8_192  # completions a TextFormat keeps decoded, each of at most TEXT_CACHE_TOKENS ids (~1 KB each)
TEXT_CACHE_TOKENS = 32
transformers_logging.disable_progress_bar()  # our own progress bars speak for long work


@dataclass(frozen=True)
class SamplingParams:
    """How to turn logits into the sampling distribution; `greedy` ignores the rest."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 16
    greedy: bool = False
    logit_noise: float = 0.0  # std of Gaussian noise added to the sampler's logits (actor/learner mismatch)

    @classmethod
    def from_config(cls, cfg: SamplerConfig) -> SamplingParams:
        return cls(cfg.temperature, cfg.top_k, cfg.top_p, cfg.max_new_tokens, logit_noise=cfg.frictions.logit_noise)


@dataclass
class Generation:
    """Completions of a batch of prompts. Row i of every [N, ...] tensor is one completion.

    `completion_ids_NL` is right-padded with the pad id; `completion_mask_NL` is 1 on sampled tokens (the
    end-of-sequence token included) and 0 after it; `logp_NL` holds the sampled tokens' log-probs under the
    sampling distribution; `version_NL` the weight version that produced each token (interruptible rollouts).
    """

    prompt_ids_NP: torch.Tensor
    prompt_mask_NP: torch.Tensor
    completion_ids_NL: torch.Tensor
    completion_mask_NL: torch.Tensor
    logp_NL: torch.Tensor
    version_NL: torch.Tensor


def run_process(process: Generator[object, None, T]) -> T:
    """Run a suspendable process (a generator) to completion and return its result."""
    while True:
        try:
            next(process)
        except StopIteration as done:
            return done.value


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("model.device is 'cuda' but no CUDA device is available")
    return torch.device(name)


def build_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase, seed: int) -> PreTrainedModel:
    """A freshly initialised Qwen3- or Llama-style causal LM sized by `cfg` (for tests and built-in tasks)."""
    from transformers import LlamaConfig, Qwen3Config

    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.hidden_size // cfg.num_heads,
        "max_position_embeddings": cfg.max_positions,
        "tie_word_embeddings": True,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": None,
    }
    arch_cfg = Qwen3Config(**common) if cfg.arch == "qwen3" else LlamaConfig(**common)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(arch_cfg, dtype=torch.float32)


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probs of the sampling distribution: temperature, then top-k, then top-p (nucleus), then log-softmax.

    Filtered-out tokens get -inf. Works on any leading shape [..., V] and is differentiable in the kept logits.
    """
    logits = logits.float() / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs  # keep a token while the mass before it is < top_p
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logits, dim=-1)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip left padding: cumsum(mask) - 1, clamped at 0 on padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a transformers checkpoint directory, padding on the left (generation), with a pad token."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise PathNotFoundError(f"model.path {str(path)!r} is not a transformers checkpoint (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _backend_encoder(tokenizer: PreTrainedTokenizerBase) -> Callable[[str], list[int]]:
    """One text's ids without special tokens: what `tokenizer(text, add_special_tokens=False)` gives.

    A fast tokenizer's own Rust encoder gives the same ids at ~1/6 of the cost of the transformers call around it
    (13 vs 72 us a prompt on the demo's tokenizer), unless that encoder was saved with truncation or padding, which
    the transformers call switches off for each call and a direct call would apply: then, and for slow
    tokenizers, the transformers call."""
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    if backend is not None and backend.truncation is None and backend.padding is None:
        return lambda text: backend.encode(text, add_special_tokens=False).ids
    return lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])


class TextFormat:
    """The text side of a policy: prompts (each a user turn of the chat template when asked) -> left-padded ids,
    completion ids -> texts. Samplers need only this and an engine; the model may live elsewhere (vLLM)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, chat_template: bool = False) -> None:
        if chat_template and not getattr(tokenizer, "chat_template", None):
            raise ValueError("task.chat_template is true but the tokenizer has no chat template")
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer needs a pad token and an eos token")
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.pad_id: int = tokenizer.pad_token_id
        self.eos_id: int = tokenizer.eos_token_id
        self._ids: OrderedDict[str, list[int]] = OrderedDict()  # prompt -> its ids, most recently used last
        self._ids_lock = threading.Lock()  # a live learner's intake asks from its service threads
        self._texts: OrderedDict[tuple[int, ...], str] = OrderedDict()  # short completion ids -> text
        self._texts_lock = threading.Lock()
        self._encode = _backend_encoder(tokenizer)

    def encode_prompts(
        self, prompts: list[str], device: torch.device | str = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt ids [N, P] padded to the longest on the tokenizer's padding side (left for generation) and the
        attention mask [N, P] (each prompt a user turn if chat_template): what `tokenizer(prompts, padding=True,
        add_special_tokens=False)` gives, from per-prompt ids tokenized once (`prompt_ids`)."""
        rows = [self.prompt_ids(p) for p in prompts]
        P = max((len(r) for r in rows), default=0)
        ids = torch.full((len(rows), P), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), P), dtype=torch.long)
        left = self.tokenizer.padding_side == "left"
        for i, row in enumerate(rows):
            cols = slice(P - len(row), P) if left else slice(0, len(row))
            ids[i, cols] = torch.tensor(row, dtype=torch.long)
            mask[i, cols] = 1
        return ids.to(device), mask.to(device)

    def prompt_ids(self, prompt: str) -> list[int]:
        """The ids of one prompt as `encode_prompts` makes them, without padding (a copy).

        Tokenizing is deterministic and its call costs far more than the ids of a short prompt (the sampler encodes
        each prompt, the learner's intake checks every group's), so ids are kept for the last `PROMPT_CACHE`
        prompts: every group of a prompt, and most repeats of a data set's, skip the tokenizer.
        """
        with self._ids_lock:
            ids = self._ids.get(prompt)
            if ids is not None:
                self._ids.move_to_end(prompt)
                return list(ids)
        text = prompt
        if self.chat_template:
            text = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        ids = self._encode(text)
        with self._ids_lock:
            self._ids[prompt] = ids
            if len(self._ids) > PROMPT_CACHE:
                self._ids.popitem(last=False)
        return list(ids)

    def encode_completion(self, text: str) -> list[int]:
        """The ids of `text` followed by end-of-sequence: how a completion of that text is tokenized."""
        return [*self._encode(text), self.eos_id]

    def decode_completions(self, completion_ids_NL: torch.Tensor, completion_mask_NL: torch.Tensor) -> list[str]:
        """Completion texts, without end-of-sequence and padding.

        Decoding is deterministic and its call costs far more than a short completion's ids: the texts of the last
        `TEXT_CACHE` completions of at most `TEXT_CACHE_TOKENS` ids are kept by those exact ids (short answers
        recur within a group and across groups; the sampler scores each group and the learner's reward recheck
        decodes it again). Longer ones rarely repeat and are decoded each time."""
        rows = [
            tuple(t for t, keep in zip(ids, m, strict=True) if keep and t != self.eos_id)
            for ids, m in zip(completion_ids_NL.tolist(), completion_mask_NL.tolist(), strict=True)
        ]
        with self._texts_lock:
            known = [self._texts.get(row) for row in rows]
        decoded: dict[tuple[int, ...], str] = {}
        for row, text in zip(rows, known, strict=True):
            if text is None and row not in decoded:
                decoded[row] = self.tokenizer.decode(list(row), skip_special_tokens=True)
        if decoded:
            with self._texts_lock:
                for row, text in decoded.items():
                    if len(row) <= TEXT_CACHE_TOKENS:
                        self._texts[row] = text
                while len(self._texts) > TEXT_CACHE:
                    self._texts.popitem(last=False)
        return [decoded[row] if text is None else text for row, text in zip(rows, known, strict=True)]


class Policy:
    """A causal LM and its tokenizer on one device."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        device: torch.device,
        chat_template: bool = False,
    ) -> None:
        self.text = TextFormat(tokenizer, chat_template)
        self.model = model.to(device)
        self.tokenizer = tokenizer
        self.device = device
        self.chat_template = chat_template
        self.pad_id: int = self.text.pad_id
        self.eos_id: int = self.text.eos_id

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: ModelConfig, seed: int) -> Policy:
        """Load `cfg.path` if set, else build `cfg.arch` with the character tokenizer."""
        device = resolve_device(cfg.device)
        if cfg.path is not None:
            return cls.load(cfg.path, device)
        tokenizer = build_char_tokenizer()
        return cls(build_model(cfg, tokenizer, seed), tokenizer, device)

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        chat_template: bool = False,
    ) -> Policy:
        """Load a transformers checkpoint directory (weights + tokenizer), computing in `dtype`."""
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        return cls(model, tokenizer, torch.device(device), chat_template)

    def save(self, path: str | Path) -> None:
        """Save as a transformers checkpoint: safetensors weights, config and tokenizer."""
        self.model.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)

    # ------------------------------------------------------------------ text <-> ids
    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded prompt ids [N, P] and attention mask [N, P] on the policy's device (`TextFormat`)."""
        return self.text.encode_prompts(prompts, self.device)

    def decode_completions(self, completion_ids_NL: torch.Tensor, completion_mask_NL: torch.Tensor) -> list[str]:
        """Completion texts, without end-of-sequence and padding."""
        return self.text.decode_completions(completion_ids_NL, completion_mask_NL)

    # ------------------------------------------------------------------ forward passes
    def _logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache=None, positions=None):
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions if positions is not None else positions_from_mask(attention_mask),
            past_key_values=cache,
            use_cache=cache is not None,
        )
        return out.logits, out.past_key_values

    def token_logprobs(
        self,
        prompt_ids_NP: torch.Tensor,
        prompt_mask_NP: torch.Tensor,
        completion_ids_NL: torch.Tensor,
        completion_mask_NL: torch.Tensor,
        params: SamplingParams,
    ) -> torch.Tensor:
        """Teacher-forced log-probs [N, L] of the completion tokens under the sampling distribution.

        Carries gradients unless called under `torch.no_grad()`. Entries where the completion mask is 0 are
        set to 0.
        """
        input_ids = torch.cat([prompt_ids_NP, completion_ids_NL], dim=1)
        attention = torch.cat([prompt_mask_NP, completion_mask_NL.to(prompt_mask_NP.dtype)], dim=1)
        logits, _ = self._logits(input_ids, attention)
        P, L = prompt_ids_NP.shape[1], completion_ids_NL.shape[1]
        logp_NLV = filter_logits(logits[:, P - 1 : P + L - 1], params)  # position t predicts token t+1
        logp_NL = logp_NLV.gather(-1, completion_ids_NL.unsqueeze(-1)).squeeze(-1)
        return torch.where(completion_mask_NL.bool(), logp_NL, torch.zeros_like(logp_NL))

    def generate(
        self,
        prompt_ids_NP: torch.Tensor,
        prompt_mask_NP: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        version: int = 0,
    ) -> Generation:
        """Sample (or greedily decode) one completion per prompt row with a KV cache, all at one weight version."""
        return run_process(self.iter_generate(prompt_ids_NP, prompt_mask_NP, params, generator, lambda: version))

    def iter_generate(
        self,
        prompt_ids_NP: torch.Tensor,
        prompt_mask_NP: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None,
        current_version: Callable[[], int],
        repeats: int = 1,
    ) -> Generator[int, None, Generation]:
        """Generation as a suspendable process: yields the number of tokens sampled so far after each step and
        returns the `Generation`.

        With `repeats` > 1 the prompt rows are K distinct prompts, each completed `repeats` times (N = K * repeats
        rows, prompt-major): the prompts are encoded once and their KV cache and last logits repeated, which is
        the same, bit for bit, as encoding every copy (each row's result does not depend on the other rows;
        tests/test_policy.py checks it) for 1/repeats of the prompt compute.

        Between two steps the caller may swap the model's weights in place (AReaL's interruptible rollout);
        `current_version()` then reports a new version, the KV cache computed with the old weights is discarded
        and rebuilt from the sequence so far, and later tokens are tagged with the new version.

        The forwards run under `torch.inference_mode()`: the same kernels and floats as under `no_grad`, with less
        autograd bookkeeping per op (~5% of a small model's generation); the returned tensors are ordinary ones
        (made outside it), so callers may still edit them in place.
        """
        cache_version = current_version()
        with torch.inference_mode():
            logits, cache = self._logits(prompt_ids_NP, prompt_mask_NP, cache=DynamicCache())
        if repeats > 1:  # [K, ...] -> [N, ...]
            prompt_ids_NP = prompt_ids_NP.repeat_interleave(repeats, 0)
            prompt_mask_NP = prompt_mask_NP.repeat_interleave(repeats, 0)
            logits = logits[:, -1:].repeat_interleave(repeats, 0)
            cache.batch_repeat_interleave(repeats)
        N = prompt_ids_NP.shape[0]
        L = params.max_new_tokens
        device = self.device
        ids = torch.full((N, L), self.pad_id, dtype=torch.long, device=device)
        logp = torch.zeros((N, L), dtype=torch.float32, device=device)
        versions = torch.zeros((N, L), dtype=torch.long, device=device)
        alive = torch.ones(N, dtype=torch.bool, device=device)
        lengths = torch.zeros(N, dtype=torch.long, device=device)
        seq, attention = prompt_ids_NP, prompt_mask_NP
        for t in range(L):
            if t > 0:
                yield int(lengths.sum())
                with torch.inference_mode():
                    if current_version() != cache_version:  # weights swapped: rebuild the cache with them
                        cache_version = current_version()
                        logits, cache = self._logits(seq, attention, cache=DynamicCache())
                    else:
                        positions = attention.long().sum(-1, keepdim=True) - 1
                        logits, cache = self._logits(seq[:, -1:], attention, cache=cache, positions=positions)
            step_logits = logits[:, -1]
            if params.logit_noise > 0:  # the noisy distribution is the one sampled from, and whose log-probs count
                noise = torch.randn(step_logits.shape, generator=generator, device=device)
                step_logits = step_logits.float() + params.logit_noise * noise
            if params.greedy:
                token = step_logits.argmax(-1)
                token_logp = torch.log_softmax(step_logits.float(), -1).gather(-1, token[:, None]).squeeze(-1)
            else:
                logp_NV = filter_logits(step_logits, params)
                token = torch.multinomial(logp_NV.exp(), 1, generator=generator).squeeze(-1)
                token_logp = logp_NV.gather(-1, token[:, None]).squeeze(-1)
            token = torch.where(alive, token, torch.full_like(token, self.pad_id))
            ids[:, t] = token
            logp[:, t] = torch.where(alive, token_logp, torch.zeros_like(token_logp))
            versions[:, t] = cache_version
            lengths += alive.long()
            alive &= token != self.eos_id
            seq = torch.cat([seq, token[:, None]], dim=1)
            attention = torch.cat([attention, torch.ones_like(token[:, None])], dim=1)
            if not alive.any():
                ids, logp, versions = ids[:, : t + 1], logp[:, : t + 1], versions[:, : t + 1]
                break
        mask = torch.arange(ids.shape[1], device=device)[None, :] < lengths[:, None]
        return Generation(prompt_ids_NP, prompt_mask_NP, ids, mask.long(), logp, versions)

    def greedy_completions(self, prompts: list[str], max_new_tokens: int, batch_size: int = 512) -> list[str]:
        """Greedy decoding of each prompt (evaluation)."""
        params = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
        texts: list[str] = []
        was_training = self.model.training
        self.model.eval()
        for i in range(0, len(prompts), batch_size):
            ids, mask = self.encode_prompts(prompts[i : i + batch_size])
            gen = self.generate(ids, mask, params)
            texts += self.decode_completions(gen.completion_ids_NL, gen.completion_mask_NL)
        self.model.train(was_training)
        return texts
