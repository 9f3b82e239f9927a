"""Transfer models: when a message's last byte reaches the other side of a path, chosen by `link.transfer.model`.

- simple: arrival = start + bytes * 8 / rate + delay (the message model: no connection, no window); a cut
  holds the message until the link is back, then it is sent again whole.
- tcp:    `heterorl.network.tcp` (handshake, slow start, slow start after idle, loss recovery, RTO back-off).

A path carries one message at a time, in order (one connection): a message starts when the previous one has
left the sender (`free_at`) and never arrives before the previous one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from heterorl.config import SimpleTransfer, TransferConfig
from heterorl.network.conditions import PathConditions


@dataclass(frozen=True)
class Transfer:
    """One message on a path: `start` its first byte leaves (after any wait for the path and the handshake),
    `sent` its last byte has left the sender (the path is free), `arrival` its last byte is at the receiver."""

    start: float
    sent: float
    arrival: float
    retransmissions: int = 0


class PathTransfer(ABC):
    """One direction of a link carrying messages in order; subclasses model what a message's bytes cost."""

    def __init__(self, cond: PathConditions) -> None:
        self.cond = cond
        self.free_at = 0.0
        self.last_arrival = 0.0
        self.bytes_sent = 0

    @abstractmethod
    def _send(self, start: float, nbytes: int, fresh: bool, handshake: bool) -> Transfer:
        """The transfer of a message whose bytes may leave from `start` on."""

    def send(self, now: float, nbytes: int, *, fresh: bool = False, handshake: bool | None = None) -> Transfer:
        """Send `nbytes` at `now` (after the previous message has left); see `Link.transfer` for the flags."""
        assert nbytes >= 0, f"negative size {nbytes}"
        done = self._send(max(now, self.free_at), nbytes, fresh, fresh if handshake is None else handshake)
        arrival = max(done.arrival, self.last_arrival)
        self.free_at, self.last_arrival = done.sent, arrival
        self.bytes_sent += nbytes
        return Transfer(done.start, done.sent, arrival, done.retransmissions)


_TRANSFERS: dict[str, Callable[[TransferConfig, PathConditions, int], PathTransfer]] = {}


def register_transfer(model: str) -> Callable[[type[PathTransfer]], type[PathTransfer]]:
    """Class decorator: `make_transfer` builds this class (`cls(cfg, cond, queue_packets)`) for `model`."""

    def wrap(cls: type[PathTransfer]) -> type[PathTransfer]:
        assert model not in _TRANSFERS, f"transfer model {model!r} registered twice"
        _TRANSFERS[model] = cls  # type: ignore[assignment]
        return cls

    return wrap


def make_transfer(cfg: TransferConfig, cond: PathConditions, queue_packets: int) -> PathTransfer:
    """The transfer model a link's `transfer` section names, on one path."""
    try:
        factory = _TRANSFERS[cfg.model]
    except KeyError:
        raise ValueError(f"unknown transfer model {cfg.model!r}; known: {sorted(_TRANSFERS)}") from None
    return factory(cfg, cond, queue_packets)


@register_transfer("simple")
class SimplePath(PathTransfer):
    """arrival = start + nbytes * 8 / rate(start) + delay(start); one delay draw per attempt.

    A cut that begins before the message has arrived loses it; it is sent again, whole, when the link is back
    (a reliable transport with no back-off). `fresh` and `handshake` cost nothing here.
    """

    def __init__(self, cfg: SimpleTransfer, cond: PathConditions, queue_packets: int) -> None:
        super().__init__(cond)

    def _send(self, start: float, nbytes: int, fresh: bool, handshake: bool) -> Transfer:
        outages, attempts = self.cond.outages, 0
        first = start = outages.next_up(start)
        while True:
            rate = self.cond.rate_bps(start)
            sent = start + (0.0 if rate is None else nbytes * 8.0 / rate)
            arrival = sent + self.cond.delay(start)
            cut = outages.first_cut(start, arrival) if outages else None
            if cut is None:
                return Transfer(first, sent, arrival, attempts)
            attempts += 1
            start = cut[1]
