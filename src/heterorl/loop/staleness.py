"""Staleness control, clock-free and shared by every driver: the learner's rollout buffer with HeteroRL's window,
and the window itself (`staleness_window`). AReaL's admission by capacity is `loop.admission`.

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
    consume: str = "oldest"  # or "freshest": newest weight version first
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
        """`n` groups inside the window (the oldest, or with `consume: freshest` those of the newest versions, ties
        in arrival order) and the batch's staleness statistics, or None if too few."""
        dropped = self.drop_stale(learner_version)
        if len(self.groups) < n:
            return None
        if self.consume == "freshest":
            order = sorted(range(len(self.groups)), key=lambda i: (-self.groups[i].min_version, i))
            chosen = set(order[:n])
            batch = [g for i, g in enumerate(self.groups) if i in chosen]
            self.groups = deque(g for i, g in enumerate(self.groups) if i not in chosen)
        else:
            batch = [self.groups.popleft() for _ in range(n)]
        batch.sort(key=batch_order)  # the order uploads happened to arrive in must not change the step's floats
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


def batch_order(group: RolloutGroup) -> tuple[str, int, str]:
    """A batch's canonical order: by sampler, then in the order it generated its groups (ids are
    `<sampler>:<n>[@<session>]`). Which groups make a batch depends on arrival order; their order inside it does not,
    so a step computes the same floats however concurrent uploads interleaved."""
    head, _, session = group.group_id.partition("@")
    number = head.rpartition(":")[2]
    return group.sampler_id, int(number) if number.isdigit() else -1, session


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
