"""The learner's recheck of a group's rewards: it holds the task and its verifier, so it need not believe a sampler.

    verdict = recheck_rewards(task, group, decode)

The problem comes from the learner's own task (`Task.problem_for(prompt)`: the answer a sampler sends is never
used), the completions are decoded from the group's token ids with the learner's tokenizer, and each is scored as
a sampler scores it (the task's verifier, or the custom reward function). Verdicts:

- "" -- rewards recomputed, `rewards_G` holds them: the intake trains on the learner's rewards;
- reward_mismatch -- a claimed reward differs from the learner's by more than `tolerance`: refused, charged to its
  sampler;
- unknown_prompt -- not one of the task's training prompts (a held-out prompt, or one the task never draws):
  refused, charged to its sampler;
- unverifiable -- the task cannot tell its prompts, or the custom reward says `recomputable = False`: the rewards
  are taken as sent.

A completion whose check ran out of time on the learner (math-verify's limit) scores what the learner's verifier
says (0), and a claimed reward that differs there is not held against the sampler: a slower machine is no
evidence of a lie, and a forger gains nothing (the learner trains on its own 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from heterorl.rollout import RolloutGroup
from heterorl.tasks.base import Problem, Task

Decode = Callable[[torch.Tensor, torch.Tensor], list[str]]  # (completion ids [G, L], mask [G, L]) -> texts


@dataclass(frozen=True)
class RewardVerdict:
    reason: str  # "" | reward_mismatch | unknown_prompt | unverifiable
    rewards_G: torch.Tensor | None = None  # the learner's own rewards (float32) when recomputed
    detail: str = ""

    @property
    def refused(self) -> bool:
        return self.reason in ("reward_mismatch", "unknown_prompt")


def _score(task: Task, problem: Problem, completion: str) -> tuple[float, bool]:
    """(reward, the check timed out) as a sampler computes it, without counting it in the task's training stats."""
    if task.custom_reward is not None:
        return task.custom_reward(problem, completion), False
    verdict = task.check(problem, completion)
    return verdict.score, verdict.timed_out


def recheck_rewards(task: Task, group: RolloutGroup, decode: Decode, tolerance: float = 1e-6) -> RewardVerdict:
    """Recompute `group`'s rewards from its completions (see the module docstring)."""
    if not task.recognises_prompts:
        return RewardVerdict("unverifiable", detail=f"task {task.name!r} cannot tell its prompts")
    if task.custom_reward is not None and not task.custom_reward.recomputable:
        return RewardVerdict("unverifiable", detail=f"{task.custom_reward.spec} is not recomputable")
    problem = task.problem_for(group.prompt)
    if problem is None:
        return RewardVerdict("unknown_prompt", detail=f"{group.prompt[:60]!r} is not a training prompt of the task")
    texts = decode(group.completion_ids_GL, group.completion_mask_GL)
    scored = [_score(task, problem, text) for text in texts]
    rewards_G, off_G = compare_rewards(
        [r for r, _ in scored], [t for _, t in scored], group.rewards_G.detach().cpu().numpy(), tolerance
    )
    if off_G.any():
        i = int(off_G.nonzero()[0][0])
        detail = f"{int(off_G.sum())} of {len(texts)} rewards differ (completion {i}: claimed "
        detail += f"{float(group.rewards_G[i]):.4g}, the learner's {float(rewards_G[i]):.4g})"
        return RewardVerdict("reward_mismatch", rewards_G, detail)
    return RewardVerdict("", rewards_G)


def compare_rewards(
    rewards: list[float], timed_out: list[bool], claimed_G: np.ndarray, tolerance: float
) -> tuple[torch.Tensor, np.ndarray]:
    """(the learner's rewards as float32, as the sampler sends them; which claimed rewards differ by more than
    `tolerance` where the learner's check did not time out). In float32 throughout, the tolerance too, as a torch
    comparison of float32 tensors computes it; numpy, since each torch op on a group's few rewards costs several
    times one in numpy."""
    rewards_G = np.array(rewards, dtype=np.float32)
    off_G = (np.abs(rewards_G - claimed_G.astype(np.float32, copy=False)) > np.float32(tolerance)) & ~np.array(
        timed_out, dtype=bool
    )
    return torch.from_numpy(rewards_G), off_G
