"""Sampler: draws prompts, has its rollout engine complete them, scores them, and packs rollout groups.

It knows nothing about clocks or transports: it is handed weights (`load_weights`, passed to the engine) and
asked for groups (`iter_groups`, a suspendable process, or `generate_groups`). The engine computes in the
sampler's own dtype with the wire-dtype weights it received, so behaviour log-probs are those of the weights
the sampler actually held.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping

import torch

from heterorl.adversaries import Adversary
from heterorl.config import FrictionConfig
from heterorl.engines.base import RolloutEngine
from heterorl.engines.transformers_engine import TransformersEngine
from heterorl.frictions import FrictionInjector, frictions_active
from heterorl.policy import Policy, SamplingParams, TextFormat, run_process
from heterorl.rollout import RolloutGroup
from heterorl.tasks import Problem, Task

VERDICT_INFO = ("unparsable", "timeouts")  # the verifier's counts a group reports (`RolloutGroup.info`)


class Sampler:
    """Generates `RolloutGroup`s with the weights it was last given."""

    def __init__(
        self,
        sampler_id: str,
        engine: RolloutEngine,
        text: TextFormat,
        task: Task,
        params: SamplingParams,
        group_size: int,
        seed: int,
        frictions: FrictionConfig | None = None,
        adversary: Adversary | None = None,
    ) -> None:
        self.sampler_id = sampler_id
        self.engine = engine
        self.text = text
        self.task = task
        self.params = params
        self.group_size = group_size
        self._problems: Iterator[Problem] = task.train_stream(seed)
        self._groups_made = 0
        active = frictions is not None and frictions_active(frictions)
        self.frictions = FrictionInjector(frictions, seed + 1) if active else None
        self.adversary = adversary  # a lying sampler (experiments; heterorl.adversaries)

    @classmethod
    def from_policy(
        cls,
        sampler_id: str,
        policy: Policy,
        task: Task,
        params: SamplingParams,
        group_size: int,
        seed: int,
        frictions: FrictionConfig | None = None,
        adversary: Adversary | None = None,
    ) -> Sampler:
        """A sampler generating with `policy` through the transformers engine (sampling stream seeded by `seed`)."""
        engine = TransformersEngine(policy, seed)
        return cls(sampler_id, engine, policy.text, task, params, group_size, seed, frictions, adversary)

    # ------------------------------------------------------------------ weights
    @property
    def version(self) -> int:
        """The weight version the engine generates with (-1: none yet)."""
        return self.engine.version

    def load_weights(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        """Hand the published tensors of `version` to the engine (copied; the caller keeps its own)."""
        self.engine.load_weights(version, weights)

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

        Between steps a driver may call `load_weights` when the engine is interruptible; later tokens are then
        produced, and tagged, with the new version.
        """
        if self.version < 0:
            raise RuntimeError(f"sampler {self.sampler_id} has no weights yet")
        problems = problems if problems is not None else self.next_problems(n_groups)
        G = self.group_size
        prompt_ids, prompt_mask = self.text.encode_prompts([p.prompt for p in problems], self.engine.device)
        gen = yield from self.engine.generate(prompt_ids, prompt_mask, G, self.params)
        if self.adversary is not None:
            gen = self.adversary.replace_generation(gen, self.engine, prompt_ids, prompt_mask, G, self.params)
        if self.frictions is not None:
            gen = self.frictions.replace_completions(
                self.text, self.engine, gen, [p for p in problems for _ in range(G)], self.params
            )
        texts = self.text.decode_completions(gen.completion_ids_NL, gen.completion_mask_NL)
        if self.task.custom_reward is not None:  # the configured functions; a batched one is called once
            scored, verdicts = (
                self.task.score_batch([p for p in problems for _ in range(G)], texts),
                [{}] * len(problems),
            )
        else:
            scored, verdicts = self._verify(problems, texts)
        rewards = torch.tensor(scored)
        if self.frictions is not None:
            rewards = self.frictions.corrupt_rewards(rewards)
        groups = []
        for k, problem in enumerate(problems):
            rows = slice(k * G, (k + 1) * G)
            mask_GL = gen.completion_mask_NL[rows].cpu()
            width = max(int(mask_GL.sum(1).max()), 1)  # trim the group's padding
            info = dict(verdicts[k])
            if self.frictions is not None:
                info.update({kind: int(hit[rows].sum()) for kind, hit in self.frictions.hits.items()})
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
                    info=info,
                )
            )
        if self.adversary is not None:
            groups = self.adversary.tamper(groups, self.version)
        return groups

    def _verify(self, problems: list[Problem], texts: list[str]) -> tuple[list[float], list[dict[str, int]]]:
        """The verifier's rewards, and per group what it could not read or check in time (`VERDICT_INFO`)."""
        G = self.group_size
        scored: list[float] = []
        verdicts: list[dict[str, int]] = []
        for k, problem in enumerate(problems):
            before = self.task.stats()
            scored += [self.task.score(problem, t) for t in texts[k * G : (k + 1) * G]]
            after = self.task.stats()
            verdicts.append({key: after[key] - before[key] for key in VERDICT_INFO} if after["checked"] else {})
        return scored, verdicts
