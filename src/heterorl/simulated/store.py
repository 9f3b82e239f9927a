"""The object store on the simulated clock: the learner uploads each version once over its uplink
(`cluster.learner_uplink_mbps`), the version becomes visible when its objects and manifest are up, and each
sampler finds it at its next manifest poll (`transport.store.poll_seconds`, polls staggered across samplers) and
downloads the cheapest chain over its own link (bandwidth, delay, faults). Rollout groups through the store reach
the learner at its next listing after they are stored; a sampler with `max_pending_groups` groups stored and not
yet taken waits, as a live sink does (verdicts reach it at once: the receipt poll is not modelled).

The objects are real (the same `StorePublisher` and `StoreWeightSource` as a live run, over a `MemoryStore`);
only time is modelled. Uploads run in the event loop's thread (`drain`), so retention and what each sampler finds
are the same on every run of a config.
"""

from __future__ import annotations

import io
import math
import random
from collections.abc import Callable

from heterorl.config import RunConfig
from heterorl.eventlog import EventLog
from heterorl.loop.learner_loop import LearnerLoop
from heterorl.transport.http.client import Backoff
from heterorl.transport.store.manifest import Manifest
from heterorl.transport.store.objects import MemoryStore
from heterorl.transport.store.publisher import StorePublisher
from heterorl.transport.store.source import StoreWeightSource
from heterorl.weights import merge_patches


class SimStore:
    """The store, the learner's publisher into it and one weight source per sampler (see the module docstring)."""

    def __init__(self, cfg: RunConfig, loop: LearnerLoop, clock: Callable[[], float], n_samplers: int) -> None:
        store_cfg = cfg.transport.store
        self.poll_s = store_cfg.poll_seconds
        self.max_pending = store_cfg.max_pending_groups
        self.objects = MemoryStore("memory://simulated")
        self.weights = cfg.transport.weights == "store"
        self.rollouts = cfg.transport.rollouts == "store"
        self.publisher: StorePublisher | None = None
        self.visible: Manifest | None = None
        self.sources: list[StoreWeightSource] = []
        if self.weights:
            self.publisher = StorePublisher(
                self.objects, loop.store, store_cfg, resume=False, clock=clock, on_uploaded=loop.traffic.sent
            )
            loop.publisher.on_published.append(self.publisher.published)
            level = cfg.weights.zstd_level
            for i in range(n_samplers):
                backoff = Backoff(cfg.live.backoff_initial_s, cfg.live.backoff_max_s, random.Random(i))
                merge = lambda patches: merge_patches(patches, level=level)  # noqa: E731
                events = EventLog(io.StringIO())
                self.sources.append(
                    StoreWeightSource(self.objects, store_cfg, cfg.live, f"s{i}", backoff, events, merge)
                )
        self.n = n_samplers

    def upload(self) -> tuple[int, Manifest | None]:
        """Upload the versions published since the last call: (bytes, the manifest that makes them visible)."""
        assert self.publisher is not None
        uploaded = self.publisher.drain()
        return sum(n for _, n in uploaded), (self.publisher.manifest if uploaded else None)

    def next_poll(self, index: int, at: float) -> float:
        """Sampler `index`'s first manifest poll at or after `at` (polls every poll_s, staggered by index)."""
        phase = self.poll_s * index / max(self.n, 1)
        return phase + math.ceil(max(at - phase, 0.0) / self.poll_s - 1e-9) * self.poll_s

    def next_listing(self, at: float) -> float:
        """The learner's first rollout listing at or after `at`."""
        return math.ceil(at / self.poll_s - 1e-9) * self.poll_s

    def fetch(self, index: int, held: tuple[int | None, str | None]) -> tuple[bytes, int] | None:
        """Sampler `index`'s update from `held` to the visible manifest: (envelope, bytes downloaded) or None."""
        if self.visible is None:
            return None
        source = self.sources[index]
        before = source.downloaded
        envelope = source.update_from(self.visible, *held)
        if envelope is None:
            return None
        return envelope, source.downloaded - before + len(self.visible.to_bytes())

    def summary(self) -> dict:
        out: dict = {"objects": len(self.objects.objects)}
        if self.publisher is not None:
            out["uploaded_bytes"] = self.publisher.uploaded_bytes
            out["sampler_faults"] = {f"s{i}": dict(s.counts) for i, s in enumerate(self.sources) if s.counts}
        return out
