"""Staleness control, clock-free and shared by every driver: the learner's rollout buffer with HeteroRL's window,
and AReaL's admission rule for starting generations.

Staleness of a group = learner version when it is trained - the oldest weight version among its tokens.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from heterorl.rollout import RolloutGroup


@dataclass
class RolloutBuffer:
    """Groups waiting for the learner, oldest first.

    `max_staleness` (None = no window): a group whose oldest token is more than this many versions behind the
    learner is dropped and counted, never trained on (HeteroRL's learner-side window).
    """

    max_staleness: int | None = None
    groups: deque[RolloutGroup] = field(default_factory=deque)
    dropped: int = 0
    staleness_hist: Counter[int] = field(default_factory=Counter)

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, group: RolloutGroup) -> None:
        self.groups.append(group)

    def drop_stale(self, learner_version: int) -> int:
        """Remove the groups outside the window; returns how many."""
        if self.max_staleness is None:
            return 0
        kept = deque(g for g in self.groups if g.staleness(learner_version) <= self.max_staleness)
        dropped = len(self.groups) - len(kept)
        self.groups = kept
        self.dropped += dropped
        return dropped

    def take(self, n: int, learner_version: int) -> tuple[list[RolloutGroup], dict[str, float]] | None:
        """The `n` oldest groups inside the window and the batch's staleness statistics, or None if too few."""
        dropped = self.drop_stale(learner_version)
        if len(self.groups) < n:
            return None
        batch = [self.groups.popleft() for _ in range(n)]
        staleness = [g.staleness(learner_version) for g in batch]
        self.staleness_hist.update(staleness)
        stats = {
            "stale/mean": sum(staleness) / n,
            "stale/max": float(max(staleness)),
            "stale/dropped_step": float(dropped),
            "stale/dropped_total": float(self.dropped),
        }
        return batch, stats

    def summary(self) -> dict[str, object]:
        total = sum(self.staleness_hist.values())
        return {
            "staleness_mean": sum(k * v for k, v in self.staleness_hist.items()) / max(total, 1),
            "staleness_max": max(self.staleness_hist, default=0),
            "staleness_histogram": {str(k): v for k, v in sorted(self.staleness_hist.items())},
            "groups_dropped": self.dropped,
        }


def staleness_window(max_staleness: int | None, eta: int | None) -> int | None:
    """The learner-side window: `max_staleness`, tightened to `eta` when admission control is on.

    Admission bounds staleness only if groups are trained in the order they were admitted; samplers of unequal
    speed deliver out of order, so a group admitted early can arrive after later ones and be trained staler. As
    AReaL does (capacity control at submission plus filtering of samples that became too stale), the learner
    then drops the few groups over `eta`, so no trained group is ever staler than the bound.
    """
    if eta is None:
        return max_staleness
    return eta if max_staleness is None else min(max_staleness, eta)


class Admission:
    """AReaL's admission rule: a generation of n groups with weights of version v may start only while

        started - released - dropped + n <= (eta + v + 1) * B

    `started` counts the groups ever admitted, `released` those that will never reach the learner (refused, lost,
    or held by a sampler that went away), `dropped` those the window discarded, B = groups per learner step.
    The learner consumes B groups per version, so with groups trained in the order they were admitted, a group
    generated at version v is trained at version <= v + eta: staleness <= eta. v is the version the generation
    uses (the sampler's), not the learner's: a sampler whose weights lag must catch up before it may start.
    `eta = None` admits everything.
    """

    def __init__(self, eta: int | None, groups_per_step: int) -> None:
        self.eta, self.B = eta, groups_per_step
        self.started = 0
        self.released = 0

    @property
    def active(self) -> bool:
        return self.eta is not None

    def in_budget(self, dropped: int) -> int:
        """Groups admitted that still count against the budget."""
        return self.started - self.released - dropped

    def try_start(self, n: int, version: int, dropped: int) -> bool:
        """Admit n groups generated with weights of `version` (and count them) if the rule allows it."""
        if self.eta is not None and self.in_budget(dropped) + n > (self.eta + version + 1) * self.B:
            return False
        self.started += n
        return True

    def release(self, n: int) -> None:
        """n admitted groups will never arrive: give their budget back."""
        self.released += n
