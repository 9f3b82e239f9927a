"""Samplers that lie, for experiments on the learner's defences (`adversaries: {node name: ...}` in a config).

Beside Delightful PG's frictions (heterorl.frictions: an honest sampler's faults), these are a dishonest sampler's
choices; each acts on a share of its groups (`share`, from its own seeded stream):

- forged_logprobs: every behaviour log-prob shifted by `logprob_shift` (kept <= 0 so it passes the range checks):
  a negative shift inflates every importance ratio, a positive one deflates it.
- poison: one token of the group, in a completion with a below-average reward (a negative advantage, where the
  clipped objectives do not bound the ratio), claimed at `poison_logprob` (-70 by default, inside the intake's
  -104 bound): the issue's measured attack, a non-finite step.
- other_model: the completions come from another model (the base model it started from, never updated) under the
  version it claims; their log-probs are that model's own, or (`rescore`) the claimed version's re-score of the
  foreign tokens, which a careful forger computes with one forward pass. Rewards are the honest scores of the
  foreign completions. Per generation call (all its groups at once).
- forged_rewards: rewards inverted, max - r within the group's task range (1 - r for 0/1 rewards).
- replay: a group it already sent, again under a fresh group id, every token re-tagged with its current version
  (so no staleness window drops it).

Nothing is reported to the learner (`RolloutGroup.info` stays honest-looking); `counts` say what it did.
"""

from __future__ import annotations

import copy
from collections import deque
from typing import TYPE_CHECKING

import torch

from heterorl.config import AdversaryConfig
from heterorl.policy import Generation, SamplingParams, run_process
from heterorl.rollout import RolloutGroup

if TYPE_CHECKING:
    from heterorl.engines.base import RolloutEngine

REPLAY_MEMORY = 256  # groups a replaying sampler keeps to send again


class Adversary:
    """One dishonest sampler's behaviour (see the module docstring). `other` is the other model's engine
    (other_model only), loaded with its weights."""

    def __init__(self, cfg: AdversaryConfig, seed: int, other: RolloutEngine | None = None) -> None:
        if cfg.kind == "other_model" and other is None:
            raise ValueError("adversary other_model needs the other model's engine")
        self.cfg, self.other = cfg, other
        self.generator = torch.Generator().manual_seed(seed)
        self.counts = {"groups": 0, "tampered": 0}
        self._sent: deque[RolloutGroup] = deque(maxlen=REPLAY_MEMORY)
        self._replaced = False  # the current generation came from the other model

    def _draw(self) -> bool:
        return bool(torch.rand(1, generator=self.generator)[0] < self.cfg.share)

    # ---------------------------------------------------------------- before scoring
    def replace_generation(
        self,
        gen: Generation,
        engine: RolloutEngine,
        prompt_ids_KP: torch.Tensor,
        prompt_mask_KP: torch.Tensor,
        G: int,
        params: SamplingParams,
    ) -> Generation:
        """other_model: the other model's completions of the same prompts, under the engine's version."""
        if self.cfg.kind != "other_model" or not self._draw():
            return gen
        assert self.other is not None
        foreign = run_process(self.other.generate(prompt_ids_KP, prompt_mask_KP, G, params))
        logp = foreign.logp_NL
        if self.cfg.rescore:
            logp = engine.score(
                foreign.prompt_ids_NP,
                foreign.prompt_mask_NP,
                foreign.completion_ids_NL,
                foreign.completion_mask_NL,
                params,
            )
        version = torch.full_like(foreign.version_NL, engine.version)
        self._replaced = True
        return Generation(
            foreign.prompt_ids_NP,
            foreign.prompt_mask_NP,
            foreign.completion_ids_NL,
            foreign.completion_mask_NL,
            logp * foreign.completion_mask_NL,
            version,
        )

    # ---------------------------------------------------------------- after scoring
    def tamper(self, groups: list[RolloutGroup], version: int, max_reward: float = 1.0) -> list[RolloutGroup]:
        """The groups as this sampler sends them (`version`: the one its engine generates with)."""
        out = []
        replaced, self._replaced = self._replaced, False
        for group in groups:
            self.counts["groups"] += 1
            if self.cfg.kind == "other_model":
                self.counts["tampered"] += replaced
                out.append(group)
                continue
            sent = self._tampered(group, version, max_reward) if self._draw() else None
            if sent is None:
                self._sent.append(group)
                out.append(group)
                continue
            self.counts["tampered"] += 1
            out.append(sent)
        return out

    def _tampered(self, group: RolloutGroup, version: int, max_reward: float) -> RolloutGroup | None:
        kind, mask = self.cfg.kind, group.completion_mask_GL.bool()
        bad = copy.deepcopy(group)
        if kind == "forged_logprobs":
            bad.behavior_logp_GL = torch.where(
                mask, (bad.behavior_logp_GL + self.cfg.logprob_shift).clamp(max=0.0), 0.0
            )
        elif kind == "poison":
            below = (bad.rewards_G < bad.rewards_G.mean()).nonzero().squeeze(-1)
            if not len(below):
                return None  # no completion with a negative advantage: the poison would be clipped away
            bad.behavior_logp_GL[int(below[0]), 0] = self.cfg.poison_logprob
        elif kind == "forged_rewards":
            bad.rewards_G = (max_reward - bad.rewards_G).to(bad.rewards_G.dtype)
        elif kind == "replay":
            if not self._sent:
                return None
            old = self._sent[int(torch.randint(len(self._sent), (1,), generator=self.generator))]
            bad = copy.deepcopy(old)
            bad.group_id, bad.created_at, bad.finished_at = group.group_id, group.created_at, group.finished_at
            bad.version_GL = torch.full_like(bad.version_GL, version)
        return bad
