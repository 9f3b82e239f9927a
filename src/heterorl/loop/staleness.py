"""The learner's rollout buffer: FIFO groups, HeteroRL's staleness window, batches with their staleness.

Shared by every clock (simulated and live), so staleness is measured and controlled the same way everywhere.
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
