"""What the learner knows about its samplers: who was heard from when, at which version, how idle.

Samplers only connect out, so the learner learns about them from their requests (the sampler name, its held
version and its idle share travel as query parameters of GET /v1/weights). Thread-safe: the HTTP handlers
write, the training thread reads for metrics.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass
class PeerInfo:
    last_seen: float  # time.monotonic()
    version: int | None
    idle: float | None  # share of its uptime not spent generating, as it reported


class Peers:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._peers: dict[str, PeerInfo] = {}

    def heard(self, name: str, version: int | None = None, idle: float | None = None) -> None:
        with self._lock:
            old = self._peers.get(name)
            self._peers[name] = PeerInfo(
                time.monotonic(),
                version if version is not None else (old.version if old else None),
                idle if idle is not None else (old.idle if old else None),
            )

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
