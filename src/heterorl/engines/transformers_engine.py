"""The transformers rollout engine: heterorl's own KV-cache decode loop over a transformers causal LM.

The CPU default and the reference every other engine is checked against: its log-probs equal the learner's
teacher-forced log-probs of the same tokens (tested to 1e-5), and it is interruptible — new weights can be loaded
between two decoding steps; the KV cache computed with the old weights is then rebuilt (`Policy.iter_generate`).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping

import torch

from heterorl.engines.base import EngineError, RolloutEngine
from heterorl.policy import Generation, Policy, SamplingParams


class TransformersEngine(RolloutEngine):
    """Generates with `policy.model` (in the policy's compute dtype) from a seeded torch generator."""

    name = "transformers"
    interruptible = True

    def __init__(self, policy: Policy, seed: int) -> None:
        self.policy = policy
        self.device = policy.device
        self.policy.model.eval()
        self.generator = torch.Generator(device=policy.device).manual_seed(seed)
        self._version = -1
        self._params = dict(self.policy.model.named_parameters())

    @property
    def version(self) -> int:
        return self._version

    def load_weights(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        """Overwrite the published parameters (all of them, or the LoRA adapter's) with `weights`, copied and
        cast to the model's dtype."""
        expected = {name for name, p in self._params.items() if p.requires_grad}
        missing, unknown = expected - set(weights), set(weights) - set(self._params)
        if missing or unknown:
            raise EngineError(
                f"weights for version {version}: missing {sorted(missing)[:3]}, unknown {sorted(unknown)[:3]}"
            )
        with torch.no_grad():
            for name, tensor in weights.items():
                self._params[name].copy_(tensor)
        self._version = version

    def generate(
        self, prompt_ids_KP: torch.Tensor, prompt_mask_KP: torch.Tensor, group_size: int, params: SamplingParams
    ) -> Generator[int, None, Generation]:
        if self._version < 0:
            raise EngineError("the engine has no weights yet")
        return self.policy.iter_generate(
            prompt_ids_KP, prompt_mask_KP, params, self.generator, lambda: self._version, repeats=group_size
        )

    def score(
        self,
        prompt_ids_NP: torch.Tensor,
        prompt_mask_NP: torch.Tensor,
        completion_ids_NL: torch.Tensor,
        completion_mask_NL: torch.Tensor,
        params: SamplingParams,
    ) -> torch.Tensor:
        with torch.no_grad():
            return self.policy.token_logprobs(
                prompt_ids_NP, prompt_mask_NP, completion_ids_NL, completion_mask_NL, params
            )
