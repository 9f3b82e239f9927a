"""What the learner knows about its samplers: who was heard from when, at which version, how idle, how many weight
updates failed to apply there.

In a live cluster samplers only connect out, so the learner learns about them from their requests (name, held
version, idle share and failed updates travel as query parameters of GET /v1/weights); the simulated driver
reports its nodes directly. Thread-safe: HTTP handlers write, the training thread reads for metrics.

Only the run's own sampler names (`cluster.samplers`) are tracked: names arrive in requests, and a client making
up a new one per request would otherwise grow this table, the public status and every metrics record forever.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class PeerInfo:
    last_seen: float  # time.monotonic()
    version: int | None
    idle: float | None  # share of its uptime not spent generating, as it reported
    failed: int = 0  # weight updates it could not apply (corrupt, wrong base), as it reported


class Peers:
    def __init__(self, names: Iterable[str]) -> None:
        self.names = frozenset(names)  # the only names tracked
        self._lock = threading.Lock()
        self._peers: dict[str, PeerInfo] = {}

    def heard(
        self, name: str, version: int | None = None, idle: float | None = None, failed: int | None = None
    ) -> bool:
        """Record a request of sampler `name`; False (nothing recorded) for a name that is not one of the run's."""
        if name not in self.names:
            return False
        with self._lock:
            old = self._peers.get(name)
            self._peers[name] = PeerInfo(
                time.monotonic(),
                version if version is not None else (old.version if old else None),
                idle if idle is not None else (old.idle if old else None),
                failed if failed is not None else (old.failed if old else 0),
            )
        return True

    def snapshot(self) -> dict[str, PeerInfo]:
        with self._lock:
            return dict(self._peers)

    def connected(self, window_s: float) -> list[str]:
        """Names heard from within the last `window_s` seconds."""
        now = time.monotonic()
        with self._lock:
            return sorted(n for n, p in self._peers.items() if now - p.last_seen <= window_s)

    def status(self, window_s: float) -> dict[str, dict]:
        now = time.monotonic()
        return {
            name: {
                "seconds_since_seen": round(now - p.last_seen, 3),
                "connected": now - p.last_seen <= window_s,
                "version": p.version,
                "idle": p.idle,
            }
            for name, p in sorted(self.snapshot().items())
        }
