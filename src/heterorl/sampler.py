"""Sampler: a policy copy at some weight version that generates and scores rollout groups.

It knows nothing about clocks or transports: it is handed weights (`load_weights`) and asked for groups
(`generate_groups`). Its weights are stored in the wire dtype (bf16 by default, as an inference server would
hold them) and computed with in the model's dtype, so its log-probs are those of the weights it received.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping

import torch

from heterorl.config import FrictionConfig
from heterorl.frictions import FrictionInjector
from heterorl.policy import Policy, SamplingParams, run_process
from heterorl.rollout import RolloutGroup
from heterorl.tasks import Problem, Task


class Sampler:
    """Generates `RolloutGroup`s with the weights it was last given."""

    def __init__(
        self,
        sampler_id: str,
        policy: Policy,
        task: Task,
        params: SamplingParams,
        group_size: int,
        seed: int,
        frictions: FrictionConfig | None = None,
    ) -> None:
        self.sampler_id = sampler_id
        self.policy = policy
        self.policy.model.eval()
        self.task = task
        self.params = params
        self.group_size = group_size
        self.version: int = -1  # no weights received yet
        self.generator = torch.Generator(device=policy.device).manual_seed(seed)
        self._problems: Iterator[Problem] = task.train_stream(seed)
        self._groups_made = 0
        active = frictions is not None and (
            frictions.actor_bug or frictions.rare_discovery or frictions.reward_corruption
        )
        self.frictions = FrictionInjector(frictions, seed + 1) if active else None

    # ------------------------------------------------------------------ weights
    def load_weights(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        """Overwrite the published parameters (all of them, or the LoRA adapter's) with `weights` (copied and
        cast to the model's dtype) and set the version."""
        params = dict(self.policy.model.named_parameters())
        expected = {name for name, p in params.items() if p.requires_grad}
        missing, unknown = expected - set(weights), set(weights) - set(params)
        if missing or unknown:
            raise ValueError(
                f"weights for version {version}: missing {sorted(missing)[:3]}, unknown {sorted(unknown)[:3]}"
            )
        with torch.no_grad():
            for name, tensor in weights.items():
                params[name].copy_(tensor)
        self.version = version

    # ------------------------------------------------------------------ generation
    def next_problems(self, n: int) -> list[Problem]:
        return [next(self._problems) for _ in range(n)]

    def generate_groups(self, n_groups: int, problems: list[Problem] | None = None) -> list[RolloutGroup]:
        """Draw `n_groups` prompts (or use `problems`), sample G completions each in one batch, score them."""
        return run_process(self.iter_groups(n_groups, problems))

    def iter_groups(
        self, n_groups: int, problems: list[Problem] | None = None
    ) -> Generator[int, None, list[RolloutGroup]]:
        """`generate_groups` as a suspendable process: yields tokens sampled so far after each decoding step.

        Between steps a driver may call `load_weights` (an interruptible rollout); later tokens are then
        produced, and tagged, with the new version.
        """
        if self.version < 0:
            raise RuntimeError(f"sampler {self.sampler_id} has no weights yet")
        problems = problems if problems is not None else self.next_problems(n_groups)
        G = self.group_size
        prompt_ids, prompt_mask = self.policy.encode_prompts([p.prompt for p in problems])
        gen = yield from self.policy.iter_generate(
            prompt_ids.repeat_interleave(G, 0),
            prompt_mask.repeat_interleave(G, 0),
            self.params,
            self.generator,
            lambda: self.version,
        )
        if self.frictions is not None:
            gen = self.frictions.replace_completions(
                self.policy, gen, [p for p in problems for _ in range(G)], self.params
            )
        texts = self.policy.decode_completions(gen.completion_ids_NL, gen.completion_mask_NL)
        rewards = torch.tensor([self.task.score(problems[i // G], t) for i, t in enumerate(texts)])
        if self.frictions is not None:
            rewards = self.frictions.corrupt_rewards(rewards)
        groups = []
        for k, problem in enumerate(problems):
            rows = slice(k * G, (k + 1) * G)
            mask_GL = gen.completion_mask_NL[rows].cpu()
            width = max(int(mask_GL.sum(1).max()), 1)  # trim the group's padding
            self._groups_made += 1
            groups.append(
                RolloutGroup(
                    group_id=f"{self.sampler_id}:{self._groups_made}",
                    sampler_id=self.sampler_id,
                    prompt=problem.prompt,
                    answer=problem.answer,
                    prompt_ids_P=prompt_ids[k][prompt_mask[k].bool()].cpu(),
                    completion_ids_GL=gen.completion_ids_NL[rows, :width].cpu(),
                    completion_mask_GL=mask_GL[:, :width],
                    behavior_logp_GL=gen.logp_NL[rows, :width].float().cpu(),
                    version_GL=gen.version_NL[rows, :width].cpu(),
                    rewards_G=rewards[rows].float(),
                )
            )
        return groups
