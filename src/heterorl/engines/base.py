"""The rollout engine interface: what turns prompt token ids into completions for a sampler.

A sampler owns one engine and talks to it in token ids only (the sampler tokenizes prompts and decodes
completions). An engine

- holds one weight version at a time (`version`, -1 before the first `load_weights`);
- `load_weights(version, weights)` makes the published tensors (Hugging Face names, wire dtype: exactly what a
  `WeightReceiver` holds) the ones it generates with, and raises `EngineError` when an update does not land
  (never a silent partial update);
- `generate(prompt_ids, prompt_mask, G, params)` samples G completions per prompt and reports, per token, the
  log-prob of the distribution actually sampled from (temperature, top-k, top-p applied) and the weight version
  that produced it. It is a suspendable process (a generator yielding tokens sampled so far), so a driver can
  pace it in virtual time; an engine with `interruptible = True` accepts `load_weights` between two yields and
  tags later tokens with the new version (AReaL's interruptible rollout);
- `score(...)` gives teacher-forced log-probs of given completions under the same sampling distribution (used
  where a completion is replaced after sampling, e.g. injected frictions).

Randomness is the engine's own, seeded at construction, so a sampler's stream is reproducible.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator, Mapping

import torch

from heterorl.policy import Generation, SamplingParams


class EngineError(RuntimeError):
    """The engine cannot do what was asked (an update that did not land, a missing package, a bad setting)."""


class RolloutEngine(ABC):
    """G completions per prompt with exact per-token behaviour log-probs and versions; weight updates."""

    name: str = "engine"
    interruptible: bool = False  # accepts load_weights between two decoding steps of one generation
    device: torch.device = torch.device("cpu")  # where `generate` wants its prompt tensors
    chunks_in_flight: int = 1  # `generate` processes that may run at once, advancing one shared batch

    @property
    @abstractmethod
    def version(self) -> int:
        """The weight version generation uses now (-1: no weights loaded yet)."""

    @abstractmethod
    def load_weights(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        """Generate with `weights` from now on; raise EngineError if the update did not land everywhere."""

    @abstractmethod
    def generate(
        self, prompt_ids_KP: torch.Tensor, prompt_mask_KP: torch.Tensor, group_size: int, params: SamplingParams
    ) -> Generator[int, None, Generation]:
        """G = `group_size` completions for each of the K left-padded prompts, as a suspendable process.

        Yields the number of tokens sampled so far (any number of times, possibly never) and returns a
        `Generation` of N = K * G rows, prompt-major (rows k*G .. k*G+G-1 belong to prompt k).
        """

    @abstractmethod
    def score(
        self,
        prompt_ids_NP: torch.Tensor,
        prompt_mask_NP: torch.Tensor,
        completion_ids_NL: torch.Tensor,
        completion_mask_NL: torch.Tensor,
        params: SamplingParams,
    ) -> torch.Tensor:
        """Teacher-forced log-probs [N, L] of the given completion tokens under the sampling distribution of the
        weights held now (0 where the mask is 0)."""

    def close(self) -> None:
        """Release the engine's resources (processes, memory); the default has none."""
        return
