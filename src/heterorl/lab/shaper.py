"""One direction of an emulated link, packet by packet: cut, loss, bottleneck queue, delay, reordering.

A packet entering at time t (seconds from the lab's start), of `size` bytes:

1. the link is down at t: dropped (`cut`);
2. lost with the path's packet loss probability (`loss`);
3. with a rate R: it joins the bottleneck queue and is serialised after the packets before it, leaving at
   out = max(t, previous out) + size * 8 / R; a queue already holding `queue_packets` packets drops it (`queue`).
   Unlimited rate: out = t;
4. it is delivered at out + delay(t), the path's delay model (or trace) drawn for this packet, and never before
   the packet ahead of it (delay jitter does not reorder: a real path is FIFO), unless
5. it is picked for reordering (`packet_reorder`): it is held `packet_reorder_seconds` longer, and later packets
   may overtake it;
6. a cut that begins before its delivery loses it (`cut`).

Pure bookkeeping, no I/O: the router (`heterorl.lab.router`) calls `admit` and writes the packet out later.
"""

from __future__ import annotations

from collections import Counter, deque

from heterorl.config import FaultConfig
from heterorl.network import PathConditions


class PacketShaper:
    """The delivery time of each packet of one direction, or None when it is dropped; counters of what happened."""

    def __init__(self, cond: PathConditions, faults: FaultConfig, queue_packets: int) -> None:
        self.cond = cond
        self.reorder = faults.packet_reorder
        self.reorder_seconds = faults.packet_reorder_seconds
        self.queue_packets = queue_packets
        self.rng = cond.packet_rng
        self.out_times: deque[float] = deque()  # when each queued packet finishes serialisation
        self.tx_free = 0.0
        self.last_delivery = 0.0
        self.counts: Counter[str] = Counter()
        self.max_queue = 0

    def admit(self, t: float, size: int) -> float | None:
        """When the packet entering at t is delivered (seconds from the lab's start), or None if dropped."""
        counts = self.counts
        counts["packets"] += 1
        counts["bytes"] += size
        outages = self.cond.outages
        if outages and outages.down(t):
            counts["cut"] += 1
            return None
        loss = self.cond.loss(t)
        if loss > 0.0 and self.rng.random() < loss:
            counts["loss"] += 1
            return None
        rate = self.cond.rate_bps(t)
        out = t
        if rate is not None:
            queue = self.out_times
            while queue and queue[0] <= t:
                queue.popleft()
            if len(queue) >= self.queue_packets:
                counts["queue"] += 1
                return None
            out = self.tx_free = max(t, self.tx_free) + size * 8.0 / rate
            queue.append(out)
            self.max_queue = max(self.max_queue, len(queue))
        deliver = out + self.cond.delay(t)
        if self.reorder > 0.0 and self.rng.random() < self.reorder:
            deliver += self.reorder_seconds
            counts["reordered"] += 1
        else:
            deliver = self.last_delivery = max(deliver, self.last_delivery)
        if outages and outages.first_cut(t, deliver) is not None:
            counts["cut"] += 1
            return None
        counts["delivered"] += 1
        return deliver

    def stats(self) -> dict[str, int]:
        return {**self.counts, "max_queue": self.max_queue}
