"""Bookkeeping of the vLLM engine's requests: completions in flight, their segments, and the `Generation` they make.

Pure Python and torch (no vLLM), so it is tested in the default suite. One completion (`Sequence`) is served by
one vLLM request at a time. When weights change while it is in flight, its request is aborted and it continues
as a new request whose prompt is the original prompt plus the tokens sampled so far (a `segment`): vLLM then
recomputes the KV cache of that prefix with the new weights, so every token is sampled from, and carries the
log-prob and version of, exactly one weight version — as in the transformers engine, which rebuilds its cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Sequence_
from dataclasses import dataclass, field
from typing import Any

import torch

from heterorl.policy import Generation, SamplingParams, filter_logits

_ROUNDING = 1e-5  # largest positive log-prob accepted as float rounding of 0


@dataclass
class Sequence:
    """One completion being sampled: its prompt, tokens so far, their log-probs and weight versions."""

    prompt: list[int]
    max_tokens: int
    tokens: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    request_id: str | None = None  # the vLLM request serving it now (None between segments and when done)
    segment_version: int = -1  # the weight version of the current segment
    done: bool = False
    segments: int = 0

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.tokens)

    def context(self) -> list[int]:
        """The prompt of the next segment: the original prompt and every token sampled so far."""
        return self.prompt + self.tokens

    def extend(self, tokens: list[int], logps: list[float], eos_id: int) -> None:
        """Append a segment's new tokens (tagged with the segment's version); done at end-of-sequence or limit."""
        if len(tokens) != len(logps):
            raise ValueError(f"{len(tokens)} tokens but {len(logps)} log-probs")
        for token, logp in zip(tokens, logps, strict=True):
            if self.done:
                raise ValueError("tokens after the end of a completion")
            if not logp <= _ROUNDING:  # also rejects NaN
                raise ValueError(f"log-prob {logp} of token {token} is not <= 0")
            logp = min(logp, 0.0)  # a near-certain token's log-softmax may round just above 0
            self.tokens.append(token)
            self.logps.append(logp)
            self.versions.append(self.segment_version)
            self.done = token == eos_id or self.remaining <= 0


@dataclass
class Job:
    """A chunk: G completions of each of K prompts, prompt-major (rows k*G .. k*G+G-1 are prompt k)."""

    job_id: int
    prompt_ids_KP: torch.Tensor
    prompt_mask_KP: torch.Tensor
    group_size: int
    sequences: list[Sequence]
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.error is not None or all(s.done for s in self.sequences)

    @property
    def tokens(self) -> int:
        return sum(len(s.tokens) for s in self.sequences)

    def generation(self, pad_id: int) -> Generation:
        """The finished chunk as a `Generation` of N = K * G rows, right-padded to the longest completion."""
        if self.error is not None:
            raise RuntimeError(self.error)
        if not all(s.done for s in self.sequences):
            raise RuntimeError(f"job {self.job_id} is not finished")
        N = len(self.sequences)
        L = max(len(s.tokens) for s in self.sequences)
        ids = torch.full((N, L), pad_id, dtype=torch.long)
        mask = torch.zeros((N, L), dtype=torch.long)
        logp = torch.zeros((N, L), dtype=torch.float32)
        versions = torch.zeros((N, L), dtype=torch.long)
        for i, s in enumerate(self.sequences):
            n = len(s.tokens)
            ids[i, :n] = torch.tensor(s.tokens, dtype=torch.long)
            mask[i, :n] = 1
            logp[i, :n] = torch.tensor(s.logps, dtype=torch.float32)
            versions[i, :n] = torch.tensor(s.versions, dtype=torch.long)
        G = self.group_size
        return Generation(
            self.prompt_ids_KP.repeat_interleave(G, 0).cpu(),
            self.prompt_mask_KP.repeat_interleave(G, 0).cpu(),
            ids,
            mask,
            logp,
            versions,
        )


def make_job(
    job_id: int, prompt_ids_KP: torch.Tensor, prompt_mask_KP: torch.Tensor, group_size: int, max_tokens: int
) -> Job:
    """A job for K left-padded prompts (padding stripped: vLLM takes each prompt's own tokens)."""
    if prompt_ids_KP.shape != prompt_mask_KP.shape or prompt_ids_KP.ndim != 2:
        raise ValueError(f"prompt ids {tuple(prompt_ids_KP.shape)} and mask {tuple(prompt_mask_KP.shape)}")
    prompts = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids_KP.cpu(), prompt_mask_KP.cpu(), strict=True)]
    if any(not p for p in prompts):
        raise ValueError("an empty prompt")
    sequences = [Sequence(prompt, max_tokens) for prompt in prompts for _ in range(group_size)]
    return Job(job_id, prompt_ids_KP, prompt_mask_KP, group_size, sequences)


def sampled_logprobs(
    logprobs: Sequence_[Mapping[int, Any]], completion: list[int], vocab: int, params: SamplingParams
) -> torch.Tensor:
    """Log-probs [L] of `completion`'s tokens under the sampling distribution, from vLLM's full-vocabulary prompt
    log-probs at those positions (one {token: Logprob} per token).

    Prompt log-probs are vLLM's unprocessed log-softmax; the sampling distribution (temperature, top-k, top-p) is
    rebuilt from them with heterorl's `filter_logits` (log-softmax is shift-invariant, so they act as logits).
    """
    logp_LV = torch.full((len(completion), vocab), float("-inf"))
    for t, entry in enumerate(logprobs):
        ids = torch.tensor(list(entry.keys()), dtype=torch.long)
        logp_LV[t, ids] = torch.tensor([e.logprob for e in entry.values()], dtype=torch.float32)
    sampled_LV = filter_logits(logp_LV, params)
    return sampled_LV.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)
