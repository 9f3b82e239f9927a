"""What one direction of a link is like at time t: delay, rate, packet loss and cuts, from the config or a trace.

The transfer models (`heterorl.network.transfer`, `heterorl.network.tcp`) and the WAN lab's router read a path
only through `PathConditions`, so a trace replaces the parametric fields in both the same way: at time t a value
the trace gives wins, otherwise the config's (the delay model is then drawn from the path's seeded stream).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from heterorl.network.delays import DelayModel
from heterorl.network.outages import Outages
from heterorl.network.trace import LinkTrace

LinkPath = Literal["weights", "rollout"]
"""The two directions of a link: weights travel learner -> sampler, rollout groups sampler -> learner."""

OTHER: dict[str, LinkPath] = {"weights": "rollout", "rollout": "weights"}


class _Draws:
    """Draws from a delay model, `block` at a time (the router's per-packet cost); same stream, same values."""

    def __init__(self, model: DelayModel, rng: np.random.Generator, block: int) -> None:
        self.model, self.rng, self.block = model, rng, block
        self.buffer: list[float] = []

    def next(self) -> float:
        if not self.buffer:
            self.buffer = self.model.sample_many(self.block, self.rng)[::-1].tolist()
        return self.buffer.pop()


class PathConditions:
    """One direction of a link as the transfer models and the lab's router see it.

    `delay(t)` is the one-way delay of a message or packet sent at t; `ack_delay(t)` the other direction's delay
    for this path's acknowledgements (drawn from its own stream, so acknowledgements never shift the other path's
    delays); `rate_bps(t)` None means unlimited; `loss(t)` is the packet loss probability.
    """

    def __init__(
        self,
        path: LinkPath,
        delay_model: DelayModel,
        ack_model: DelayModel,
        rate_mbps: float | None,
        packet_loss: float,
        outages: Outages,
        trace: LinkTrace | None,
        rngs: dict[str, np.random.Generator],
        block: int = 1,
    ) -> None:
        self.path = path
        self.rate_mbps = rate_mbps
        self.packet_loss = packet_loss
        self.outages = outages
        self.trace = trace
        self.packet_rng = rngs["packets"]
        self._delays = _Draws(delay_model, rngs["delay"], block)
        self._acks = _Draws(ack_model, rngs["acks"], block)

    def delay(self, t: float) -> float:
        if self.trace is not None:
            traced = self.trace.delay(self.path, t)
            if traced is not None:
                return traced
        return self._delays.next()

    def ack_delay(self, t: float) -> float:
        if self.trace is not None:
            traced = self.trace.delay(OTHER[self.path], t)
            if traced is not None:
                return traced
        return self._acks.next()

    def rate_bps(self, t: float) -> float | None:
        mbps = self.rate_mbps
        if self.trace is not None:
            traced = self.trace.rate_mbps(self.path, t)
            if traced is not None:
                mbps = traced
        return None if mbps is None else mbps * 1e6

    def loss(self, t: float) -> float:
        if self.trace is not None:
            traced = self.trace.loss(self.path, t)
            if traced is not None:
                return traced
        return self.packet_loss
