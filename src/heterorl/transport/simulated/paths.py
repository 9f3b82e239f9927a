"""The simulated transport's paths: one direction of one connection of a sampler's link, in virtual time.

A path carries one message at a time, in order (a slow patch holds back the next message, as on one TCP
connection), and its bytes cost what the link's transfer model says (`link.transfer`: `simple`, arrival = start +
bytes / rate + delay sample; or `tcp`: handshake, slow start, slow start after idle, loss recovery and back-off
through cuts -- `heterorl.network`), with the link's rate, packet loss, cuts and trace over time. Each path is a
connection of its own (its own TCP state); the link's delay and fault streams are shared, drawn in sending order.
Message faults (drop, duplicate, reorder, corrupt) then act on the bytes, from the link's seeded stream, exactly
as the live link emulation does (`heterorl.network.FaultInjector`), and every injected fault is counted.

Sizes settled later (`draw_delay` then `arrive`): the simulator's in-process weights learn their size after they
are sent. That split exists for the `simple` model without cuts or a trace, whose arrival is start + bytes / rate
+ a delay drawn at sending time; other links settle a message's size when it is sent (`deferrable` False).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from heterorl.network import Delivery, Link, LinkPath, bandwidth_seconds
from heterorl.network.transfer import PathTransfer, make_transfer


@dataclass
class SimPath:
    """One direction of one connection of a link: FIFO delivery, the link's transfer model, faults on the bytes."""

    link: Link
    name: LinkPath
    opens: bool = True  # this direction's sender opens the connection (False: the answers to the other side's requests)
    faults: Counter[str] = field(default_factory=Counter)
    transfer: PathTransfer = field(init=False)
    opened: bool = False  # the connection exists (its first message paid the handshake)

    def __post_init__(self) -> None:
        cfg = self.link.cfg
        self.transfer = make_transfer(cfg.transfer, self.link.conditions[self.name], cfg.queue_packets)

    @property
    def lossy(self) -> bool:
        """True when faults may alter messages (then they must travel as bytes)."""
        return self.link.faults[self.name].active

    @property
    def bytes_sent(self) -> int:
        return self.transfer.bytes_sent

    @property
    def rate_mbps(self) -> float | None:
        return self.link.cfg.bandwidth_of(self.name)

    @property
    def deferrable(self) -> bool:
        """Can a message's size be settled after it was sent (`draw_delay` + `arrive`)? Only on the simple model
        with no cuts and no trace, whose arrival is start + bytes / rate + a delay drawn when it is sent."""
        return self.link.cfg.transfer.model == "simple" and not self.link.outages and self.link.trace is None

    @property
    def unlimited(self) -> bool:
        """True when the size of a message does not affect its arrival (simple model, unlimited rate)."""
        return self.deferrable and self.rate_mbps is None

    def arrival(self, now: float, nbytes: int) -> float:
        """Arrival time of a message of `nbytes` sent at `now` (advances the path's state). The first message
        starts the connection's state (tcp: the initial window) and, on the direction that opens it, waits for the
        handshake; an answering direction's first message follows a request that already paid it."""
        fresh, self.opened = not self.opened, True
        return self.transfer.send(now, nbytes, fresh=fresh, handshake=fresh and self.opens).arrival

    def draw_delay(self) -> float:
        """The next delay sample of this path's stream (one per message, in sending order); `deferrable` only."""
        assert self.deferrable, "a size settled later needs the simple model without cuts or a trace"
        return self.link.conditions[self.name].delay(0.0)

    def arrive(self, now: float, nbytes: int, delay: float) -> float:
        """`arrival` with the message's delay drawn beforehand (`draw_delay`): a sender that learns the size later
        draws at sending time, keeping the stream's order, and settles here, in the same order. The arrival is
        never before `now + delay`, and with unlimited bandwidth it does not depend on `nbytes`."""
        t = self.transfer
        start = max(now, t.free_at)
        t.free_at = start + bandwidth_seconds(nbytes, self.rate_mbps)
        t.last_arrival = max(t.free_at + delay, t.last_arrival)
        t.bytes_sent += nbytes
        self.opened = True
        return t.last_arrival

    def add_bytes(self, nbytes: int) -> None:
        """Count bytes whose arrival was known without them (an unlimited path)."""
        self.transfer.bytes_sent += nbytes

    def send(self, now: float, payload: bytes, nbytes: int | None = None) -> list[Delivery]:
        """The deliveries of `payload` sent at `now`: none (dropped), one, or two (duplicated). Its transfer costs
        `nbytes` (a modelled size, `transport.simulated.modelled`), or its own length."""
        at = self.arrival(now, len(payload) if nbytes is None else nbytes)
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
    """The learner's own upload link, shared by every weight update it sends (one transmission at a time, no
    delay: the receiver's link adds its own). None bandwidth: unlimited, and nothing waits."""

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
