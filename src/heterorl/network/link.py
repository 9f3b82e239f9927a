"""A sampler's link to the learner: seeded streams, delay models, faults, rates, cuts and transfer models."""

from __future__ import annotations

from typing import Literal

import numpy as np

from heterorl.config import LinkConfig
from heterorl.network.conditions import OTHER, LinkPath, PathConditions
from heterorl.network.delays import DelayModel, make_delay
from heterorl.network.faults import Delivery, FaultInjector
from heterorl.network.outages import Outages
from heterorl.network.trace import LinkTrace, read_trace
from heterorl.network.transfer import PathTransfer, Transfer, make_transfer

_NETWORK_DOMAIN = 0x6E6574  # "net": keeps network streams apart from other users of the run seed
_PATH_IDS: dict[str, int] = {"weights": 0, "rollout": 1}
Purpose = Literal["delay", "faults", "packets", "acks"]
_PURPOSE_IDS: dict[str, int] = {"delay": 0, "faults": 1, "packets": 2, "acks": 3}
PATHS: tuple[LinkPath, LinkPath] = ("weights", "rollout")


def link_rng(seed: int, link_index: int, path: LinkPath, purpose: Purpose) -> np.random.Generator:
    """The generator of one stream of one link.

    Seeding scheme: `SeedSequence(seed, spawn_key=(0x6E6574, link_index, path_id, purpose_id))` with path_id
    weights=0 / rollout=1 and purpose_id delay=0 / faults=1 / packets=2 (packet loss and reordering) / acks=3
    (the reverse delays of this path's acknowledgements). Streams are addressed by key, not spawned in order, so
    adding a sampler, enabling faults, or drawing more from one path never shifts another stream.
    """
    key = (_NETWORK_DOMAIN, link_index, _PATH_IDS[path], _PURPOSE_IDS[purpose])
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def bandwidth_seconds(nbytes: int, bandwidth_mbps: float | None) -> float:
    """Serialisation time nbytes * 8 / (bandwidth_mbps * 1e6); 0 for unlimited bandwidth."""
    assert nbytes >= 0, f"negative size {nbytes}"
    if bandwidth_mbps is None:
        return 0.0
    return nbytes * 8.0 / (bandwidth_mbps * 1e6)


class Link:
    """A sampler's link to the learner: per path a delay model, a fault injector, a rate, and a transfer model.

    `transfer_seconds` is the message model, delay sample + nbytes * 8 / (rate * 1e6). `transfer` runs the
    config's transfer model (`link.transfer`: simple or tcp) on the path's state, with its rate, packet loss and
    cuts over time (`conditions`; a `link.trace` file, read here, replaces the parametric values where it gives
    them).

    The link owns its generators (see `link_rng`): delay and faults for each path, and for the transfer models
    packets and acks. Methods taking an optional `rng` use the link's own stream of that path when it is None.
    `block` > 1 draws delays that many at a time (the same values; only for a link whose delays nothing else
    draws, as in the WAN lab's router).
    """

    def __init__(
        self, cfg: LinkConfig, seed: int, index: int = 0, trace: LinkTrace | None = None, block: int = 1
    ) -> None:
        self.cfg = cfg
        self.index = index
        self.trace = read_trace(cfg.trace) if trace is None and cfg.trace is not None else trace
        self.delays: dict[str, DelayModel] = {
            "weights": make_delay(cfg.weights_delay),
            "rollout": make_delay(cfg.rollout_delay),
        }
        self.delay_rngs = {p: link_rng(seed, index, p, "delay") for p in PATHS}
        self.faults = {
            "weights": FaultInjector(cfg.weights_faults, link_rng(seed, index, "weights", "faults")),
            "rollout": FaultInjector(cfg.rollout_faults, link_rng(seed, index, "rollout", "faults")),
        }
        self.outages = Outages.from_config(cfg.outages)
        if self.trace is not None:
            self.outages = self.outages.union(self.trace.outages)
        path_faults = {"weights": cfg.weights_faults, "rollout": cfg.rollout_faults}
        self.conditions = {
            p: PathConditions(
                p,
                self.delays[p],
                self.delays[OTHER[p]],
                cfg.bandwidth_of(p),
                path_faults[p].packet_loss,
                self.outages,
                self.trace,
                {
                    "delay": self.delay_rngs[p],
                    "packets": link_rng(seed, index, p, "packets"),
                    "acks": link_rng(seed, index, p, "acks"),
                },
                block,
            )
            for p in PATHS
        }
        self.transfers: dict[str, PathTransfer] = {
            p: make_transfer(cfg.transfer, self.conditions[p], cfg.queue_packets) for p in PATHS
        }

    def transfer_seconds(self, path: LinkPath, nbytes: int, rng: np.random.Generator | None = None) -> float:
        """Time for one message of `nbytes` on `path`: a delay sample plus the bandwidth term."""
        gen = self.delay_rngs[path] if rng is None else rng
        return self.delays[path].sample(gen) + bandwidth_seconds(nbytes, self.cfg.bandwidth_of(path))

    def weights_transfer_seconds(self, nbytes: int, rng: np.random.Generator | None = None) -> float:
        """Learner -> sampler transfer time of a weight update of `nbytes`."""
        return self.transfer_seconds("weights", nbytes, rng)

    def rollout_transfer_seconds(self, nbytes: int, rng: np.random.Generator | None = None) -> float:
        """Sampler -> learner transfer time of a rollout message of `nbytes`."""
        return self.transfer_seconds("rollout", nbytes, rng)

    def transfer(
        self, path: LinkPath, now: float, nbytes: int, *, fresh: bool = False, handshake: bool | None = None
    ) -> Transfer:
        """Send `nbytes` on `path` at `now` with the config's transfer model (messages of a path go in order).

        `fresh`: on a new connection (tcp: initial window, no RTT estimate); `handshake` (default: `fresh`): this
        side opens it and waits one round trip first (tcp; the simple model has no connection cost)."""
        return self.transfers[path].send(now, nbytes, fresh=fresh, handshake=handshake)

    def transmit(self, path: LinkPath, payload: bytes, sent_at: float) -> list[Delivery]:
        """Send `payload` at `sent_at`: the deliveries after transfer time and faults (possibly none)."""
        arrive = sent_at + self.transfer_seconds(path, len(payload))
        return self.faults[path].apply(payload, arrive)
