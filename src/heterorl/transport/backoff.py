"""Capped exponential backoff with equal jitter, from a seeded generator: how every transport waits before it tries
again (HTTP requests, store calls, and the simulated link, which replays the same waits in virtual time).

delay = b / 2 + U(0, b / 2),  b = min(cap, initial * 2^k)  after k failures in a row: samplers that lost the learner
together do not come back in lockstep.
"""

from __future__ import annotations

import random


class Backoff:
    """Capped exponential backoff with equal jitter."""

    def __init__(self, initial_s: float, cap_s: float, rng: random.Random) -> None:
        self.initial_s, self.cap_s, self.rng = initial_s, cap_s, rng
        self.failures = 0

    def next_delay(self) -> float:
        base = min(self.cap_s, self.initial_s * 2.0 ** min(self.failures, 64))
        self.failures += 1
        return base / 2.0 + self.rng.uniform(0.0, base / 2.0)

    def reset(self) -> None:
        self.failures = 0


class Liveness:
    """How long to wait for an answer before calling a request lost, and whether the link is up.

    timeout = max(dead_after_s, 3 * the longest of the last round trips seen): on a fast link a dead peer is noticed
    within `dead_after_s`; on a slow one (round trips of minutes) an answer that is merely slow is not mistaken for
    a loss (TCP's retransmission timeout adapts to the round trip the same way). Clock-free: callers pass times.
    """

    RECENT = 16

    def __init__(self, dead_after_s: float) -> None:
        self.dead_after_s = dead_after_s
        self.rtts: list[float] = []
        self.up = True
        self.last_answer: float | None = None

    def timeout(self) -> float:
        return max(self.dead_after_s, 3.0 * max(self.rtts, default=0.0))

    def answered(self, rtt: float, now: float) -> bool:
        """An answer came back after `rtt` seconds; True when this brings the link back up."""
        self.rtts = [*self.rtts[-(self.RECENT - 1) :], max(rtt, 0.0)]
        self.last_answer = now
        came_back = not self.up
        self.up = True
        return came_back

    def timed_out(self) -> bool:
        """A request got no answer within `timeout()`; True when this takes the link down."""
        went_down = self.up
        self.up = False
        return went_down
