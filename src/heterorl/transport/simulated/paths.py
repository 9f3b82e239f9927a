"""The simulated transport: one link per sampler, each a pair of FIFO paths with delay, bandwidth and faults.

A path transmits one message at a time (a slow patch holds back the next one, as one connection would) and
delivers in order: arrival = max(previous arrival, start + bytes / bandwidth + delay sample). Faults (drop,
duplicate, reorder, corrupt) then act on the bytes, from the link's own seeded stream, exactly as the live
link emulation does (`heterorl.network.FaultInjector`), and every injected fault is counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from heterorl.network import Delivery, Link, LinkPath, bandwidth_seconds


@dataclass
class SimPath:
    """One direction of a link: FIFO delivery, one transmission at a time, faults applied to the bytes."""

    link: Link
    name: LinkPath
    free_at: float = 0.0
    last_arrival: float = 0.0
    bytes_sent: int = 0
    faults: Counter[str] = field(default_factory=Counter)

    @property
    def lossy(self) -> bool:
        """True when faults may alter messages (then they must travel as bytes)."""
        return self.link.faults[self.name].active

    def arrival(self, now: float, nbytes: int) -> float:
        """Arrival time of a message of `nbytes` sent at `now` (advances the path's state)."""
        return self.arrive(now, nbytes, self.draw_delay())

    def draw_delay(self) -> float:
        """The next delay sample of this path's seeded stream (one per message, in sending order)."""
        return self.link.delays[self.name].sample(self.link.delay_rngs[self.name])

    def arrive(self, now: float, nbytes: int, delay: float) -> float:
        """`arrival` with the message's delay drawn beforehand: a sender that learns the size later (the simulated
        cluster's in-process weights) draws at sending time, keeping the stream's order, and settles here, in the
        same order. The arrival is never before `now + delay`, and with unlimited bandwidth it does not depend on
        `nbytes`."""
        start = max(now, self.free_at)
        self.free_at = start + bandwidth_seconds(nbytes, self.link.cfg.bandwidth_mbps)
        self.last_arrival = max(self.free_at + delay, self.last_arrival)
        self.bytes_sent += nbytes
        return self.last_arrival

    @property
    def unlimited(self) -> bool:
        """True when the size of a message does not affect its arrival."""
        return self.link.cfg.bandwidth_mbps is None

    def send(self, now: float, payload: bytes) -> list[Delivery]:
        """The deliveries of `payload` sent at `now`: none (dropped), one, or two (duplicated)."""
        at = self.arrival(now, len(payload))
        if not self.lossy:
            return [Delivery(at, payload)]
        deliveries = self.link.faults[self.name].apply(payload, at)
        if not deliveries:
            self.faults["drop"] += 1
        for d in deliveries:
            self.faults["duplicate"] += d.duplicate
            self.faults["reorder"] += d.reordered and not d.duplicate
            self.faults["corrupt"] += d.corrupted and not d.duplicate
        return deliveries


@dataclass
class SimUplink:
    """The learner's own upload link, shared by everything it sends (one transmission at a time, no delay: the
    receiver's link adds its own). None bandwidth: unlimited, and nothing waits."""

    bandwidth_mbps: float | None
    free_at: float = 0.0
    bytes_sent: int = 0

    def done_at(self, now: float, nbytes: int) -> float:
        """When `nbytes` handed over at `now` have left the learner (advances the link's state)."""
        self.bytes_sent += nbytes
        if self.bandwidth_mbps is None:
            return now
        self.free_at = max(now, self.free_at) + bandwidth_seconds(nbytes, self.bandwidth_mbps)
        return self.free_at
