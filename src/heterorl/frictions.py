"""Delightful Distributed PG's frictions, injected where they happen in a real system: the sampler.

- actor bug: with probability p a completion is replaced by a fixed wrong "landmine" sequence;
- rare discovery: with probability p a completion is replaced by the correct answer;
- reward corruption: with probability p the reward is replaced by a uniform draw from {0, 1};
- actor/learner mismatch: Gaussian noise on the sampler's logits (`SamplingParams.logit_noise`, in the policy);
- staleness comes from the network (link delays), as everywhere else in heterorl.

A replaced completion is reported with the sampler policy's own log-probs of its tokens, as an inference engine
whose output was corrupted after sampling would report them; the learner cannot tell it apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from heterorl.config import FrictionConfig
from heterorl.policy import Generation, SamplingParams, TextFormat
from heterorl.tasks import Problem

if TYPE_CHECKING:
    from heterorl.engines.base import RolloutEngine

KINDS = ("actor_bug", "rare_discovery", "reward_corruption")
"""The frictions a sampler injects (and reports per group in `RolloutGroup.info`)."""


def frictions_active(cfg: FrictionConfig) -> bool:
    return bool(cfg.actor_bug or cfg.rare_discovery or cfg.reward_corruption)


class FrictionInjector:
    """Applies the configured frictions to a generation and its rewards, from its own seeded stream.

    `hits` holds, per kind, which rows of the latest generation it changed (for per-group counts)."""

    def __init__(self, cfg: FrictionConfig, seed: int) -> None:
        self.cfg = cfg
        self.generator = torch.Generator().manual_seed(seed)
        self.counts = dict.fromkeys(KINDS, 0)
        self.hits: dict[str, torch.Tensor] = {}

    def _draw(self, n: int, p: float) -> torch.Tensor:
        return torch.rand(n, generator=self.generator) < p

    def replace_completions(
        self,
        text: TextFormat,
        engine: RolloutEngine,
        gen: Generation,
        problems_N: list[Problem],
        params: SamplingParams,
    ) -> Generation:
        """Swap some completions for the landmine or the answer; their log-probs are re-scored by the engine."""
        N = len(problems_N)
        bug = self._draw(N, self.cfg.actor_bug)
        discovery = self._draw(N, self.cfg.rare_discovery) & ~bug
        self.hits = {"actor_bug": bug, "rare_discovery": discovery}
        rows = (bug | discovery).nonzero().squeeze(-1).tolist()
        if not rows:
            return gen
        self.counts["actor_bug"] += int(bug.sum())
        self.counts["rare_discovery"] += int(discovery.sum())
        texts = {i: self.cfg.landmine if bug[i] else problems_N[i].answer for i in rows}
        ids = {i: text.encode_completion(t) for i, t in texts.items()}
        L = max(gen.completion_ids_NL.shape[1], *(len(v) for v in ids.values()))
        pad = L - gen.completion_ids_NL.shape[1]
        comp = torch.nn.functional.pad(gen.completion_ids_NL, (0, pad), value=text.pad_id)
        mask = torch.nn.functional.pad(gen.completion_mask_NL, (0, pad), value=0)
        versions = torch.nn.functional.pad(gen.version_NL, (0, pad), value=int(gen.version_NL.max()))
        logp = torch.nn.functional.pad(gen.logp_NL, (0, pad), value=0.0)
        for i, seq in ids.items():
            comp[i], mask[i] = text.pad_id, 0
            comp[i, : len(seq)] = torch.tensor(seq, device=comp.device)
            mask[i, : len(seq)] = 1
            versions[i] = int(gen.version_NL[i].max())
        r = torch.tensor(rows, device=comp.device)
        clean = SamplingParams(params.temperature, params.top_k, params.top_p, L)
        logp[r] = engine.score(gen.prompt_ids_NP[r], gen.prompt_mask_NP[r], comp[r], mask[r], clean)
        return Generation(gen.prompt_ids_NP, gen.prompt_mask_NP, comp, mask, logp, versions)

    def corrupt_rewards(self, rewards_N: torch.Tensor) -> torch.Tensor:
        """Replace some rewards by a fair coin in {0, 1}."""
        hit = self._draw(rewards_N.shape[0], self.cfg.reward_corruption)
        self.hits["reward_corruption"] = hit
        self.counts["reward_corruption"] += int(hit.sum())
        coin = (torch.rand(rewards_N.shape[0], generator=self.generator) < 0.5).to(rewards_N.dtype)
        return torch.where(hit, coin, rewards_N)
