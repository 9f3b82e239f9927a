"""Fault injection on messages: drop, duplicate, reorder, corrupt, from one seeded stream per link path."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from heterorl.config import FaultConfig


@dataclass(frozen=True)
class Delivery:
    """One arrival of a message: when, what, and which faults shaped it (for counters)."""

    at: float
    payload: bytes
    duplicate: bool = False
    reordered: bool = False
    corrupted: bool = False


class FaultInjector:
    """Applies a `FaultConfig` to messages, one independent decision per fault and message.

    Each message consumes exactly six uniforms from the generator, whatever happens to it:
    [drop, duplicate, reorder, corrupt, corrupt position, corrupt mask]. So the k-th message's fate depends only
    on the seed and k, and raising one probability never changes which messages suffer another fault.

    Semantics, in order: a dropped message yields no delivery. A reordered one arrives `reorder_seconds` late
    (so later messages may overtake it). A corrupted one has one byte XORed with a nonzero mask (position and
    mask uniform; an empty payload cannot be corrupted and passes unchanged). A duplicated one arrives twice,
    the copy right after the original, with the same (possibly corrupted) bytes and time.
    """

    DRAWS_PER_MESSAGE = 6

    def __init__(self, cfg: FaultConfig, rng: np.random.Generator) -> None:
        self.cfg = cfg
        self.rng = rng

    @property
    def active(self) -> bool:
        """False when every probability is 0 (then `apply` never alters a message)."""
        c = self.cfg
        return max(c.drop, c.duplicate, c.reorder, c.corrupt) > 0.0

    def apply(self, payload: bytes, deliver_at: float) -> list[Delivery]:
        """Deliveries to perform for a message scheduled to arrive at `deliver_at`: [] if dropped, else one
        (or two when duplicated)."""
        u_drop, u_dup, u_reorder, u_corrupt, u_pos, u_mask = self.rng.random(self.DRAWS_PER_MESSAGE)
        c = self.cfg
        if u_drop < c.drop:
            return []
        reordered = bool(u_reorder < c.reorder)
        at = deliver_at + c.reorder_seconds if reordered else deliver_at
        corrupted = bool(u_corrupt < c.corrupt) and len(payload) > 0
        if corrupted:
            payload = flip_byte(payload, int(u_pos * len(payload)), 1 + int(u_mask * 255))
        first = Delivery(at, payload, reordered=reordered, corrupted=corrupted)
        if u_dup < c.duplicate:
            return [first, Delivery(at, payload, duplicate=True, reordered=reordered, corrupted=corrupted)]
        return [first]


def flip_byte(payload: bytes, position: int, mask: int) -> bytes:
    """Return `payload` with byte `position` XORed with `mask` (1..255, so the byte always changes)."""
    assert 0 <= position < len(payload), f"position {position} outside a payload of {len(payload)} bytes"
    assert 1 <= mask <= 255, f"mask {mask} must be in 1..255"
    out = bytearray(payload)
    out[position] ^= mask
    return bytes(out)
