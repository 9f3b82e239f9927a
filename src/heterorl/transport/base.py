"""The transport interface: what a sampler and a learner need from whatever carries weights and rollout groups.

Sampler side (async, on the sampler's event loop):
- `WeightSource.pull(held version, hash, wait, idle, failed)`: an update envelope (weights/envelope.py) to the
  newest version, None when nothing newer came within `wait` seconds, or FINISHED when the run is over.
- `RolloutSink.send(body, digest)`: returns once the encoded group is on its way, with an awaitable of the
  learner's verdict ("accepted", "duplicate", "finished" or a rejection reason, loop/intake.py); at most
  `max_in_flight` groups may await their verdict at once (1 keeps HTTP's one-POST-at-a-time order).
- `AdmissionGate.admit(n, version)`: AReaL's admission (None: granted; else seconds to wait; FINISHED_WAIT).
Implementations: the HTTP client (transport/http/client.py, with `HttpRolloutSink`) and the object store
(transport/store/: `StoreWeightSource`, `StoreRolloutSink`); admission exists only over HTTP.

Learner side: weights out is a `BackgroundPublisher.on_published` callback (HTTP wakes its long-polls; the store
uploads the version's objects then the manifest), rollouts in is whatever calls `LearnerLoop.offer` (the HTTP
handler; the store's `StoreIntake`): the loop itself knows no transport. `LearnerTransport` is the lifetime of a
transport beside the HTTP service (the store's `StoreLearnerSide`).
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol


class WeightSource(Protocol):
    async def pull(
        self, version: int | None, state_hash: str | None, wait_s: float, idle: float | None, failed: int = 0
    ) -> bytes | str | None: ...


class RolloutSink(Protocol):
    max_in_flight: int

    async def send(self, payload: bytes, digest: str) -> Awaitable[str]: ...


class AdmissionGate(Protocol):
    async def admit(self, n: int, version: int) -> float | None: ...


class LearnerTransport(Protocol):
    def start(self) -> None:
        """Begin serving (after the loop published its first version)."""

    def close(self) -> None:
        """Stop, after telling samplers the run is finished when it is."""


@dataclass
class SamplerTransport:
    """What one sampler pulls weights from, sends groups to, and asks admission of (None: no admission)."""

    weights: WeightSource
    rollouts: RolloutSink
    admission: AdmissionGate | None = None
