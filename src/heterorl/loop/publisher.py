"""Weight publication off the learner's critical path (ParaBlock's communication–computation overlap), and the
accounting of what the transports send.

Weights travel through one interface whatever the codec: the learner publishes versions into a
`heterorl.weights.WeightStore` (full snapshots or PULSE patches, per `weights.codec`); a sampler's
`WeightReceiver` applies the `Update` the store builds for the version it holds. `BackgroundPublisher` runs the
publish (cast, diff, encode, hash) in a worker thread so the next learner step starts at once; a transport that
needs the new version waits for it with `result()`, or is called back with it (`on_published`). On Linux that
thread runs at a lower scheduling priority (`weights.publish_nice`): where every core is busy, the kernel gives
the training thread the core first and the publish takes what is left, instead of the two sharing it evenly.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from heterorl.config import WeightsConfig
from heterorl.weights import Published, WeightStore


class BackgroundPublisher:
    """Publishes into a WeightStore in one worker thread (or inline when `weights.overlap` is False).

    `on_published` callbacks run in the publishing thread right after a version is in the store (a live transport
    wakes its long-polls or uploads the objects there); versions are published one at a time, in order.
    """

    def __init__(self, cfg: WeightsConfig) -> None:
        self.store = WeightStore.from_config(cfg)
        self.overlap = cfg.overlap
        self._pool = (
            ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="publish", initializer=_lower_priority, initargs=(cfg.publish_nice,)
            )
            if cfg.overlap
            else None
        )
        self._pending: Future[Published] | None = None
        self._last: Published | None = None
        self._done: Published | None = None  # set by the publishing thread the moment a version is in the store
        self.on_published: list[Callable[[Published], None]] = []

    def _publish(self, version: int, weights: dict[str, torch.Tensor]) -> Published:
        published = self.store.publish(version, weights)
        self._done = published
        for callback in self.on_published:
            callback(published)
        return published

    def submit(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Start publishing `version` once the previous version is out; `weights` must not be modified
        afterwards (pass a copy)."""
        self.result()  # versions are published in order
        if self._pool is None:
            self._last = self._publish(version, weights)
        else:
            self._pending = self._pool.submit(self._publish, version, weights)

    def result(self) -> Published | None:
        """The newest publication, once complete (waits for a pending one)."""
        if self._pending is not None:
            self._last, self._pending = self._pending.result(), None
        return self._last

    def wait(self) -> None:
        """Wait until the pending publication, if any, is in the store, without taking it over (`submit` and
        `result` belong to the training thread; any thread may wait)."""
        pending = self._pending
        if pending is not None:
            pending.result()

    @property
    def last_complete(self) -> Published | None:
        """The newest publication that is complete, without waiting."""
        return self._done

    def close(self) -> None:
        self.result()
        if self._pool is not None:
            self._pool.shutdown()


def _lower_priority(nice: int) -> None:
    """Raise this thread's nice value by `nice` (Linux schedules threads by their own nice value; elsewhere the
    value is per process, so it is left alone). Raising one's own nice value needs no privilege."""
    if nice and sys.platform.startswith("linux"):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


class WeightTraffic:
    """Bytes of weight updates sent to samplers, by the version they bring a sampler to (thread-safe).

    A record of learner step k reports the updates to versions < k: in synchronous mode every sampler has
    received version k-1 before step k can train, so the figure is the same under every clock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, list[int]] = defaultdict(lambda: [0, 0])  # version -> [bytes, full bytes]
        self.total_bytes = 0
        self.total_full_bytes = 0

    def sent(self, version: int, nbytes: int, full_nbytes: int) -> None:
        """An update to `version` of `nbytes` went out (`full_nbytes`: the raw wire-dtype weights it replaces)."""
        with self._lock:
            entry = self._pending[version]
            entry[0] += nbytes
            entry[1] += full_nbytes
            self.total_bytes += nbytes
            self.total_full_bytes += full_nbytes

    def take_before(self, version: int) -> tuple[int, int]:
        """(bytes, full bytes) of the updates to versions < `version` not reported yet."""
        with self._lock:
            done = [v for v in self._pending if v < version]
            sent = sum(self._pending[v][0] for v in done)
            full = sum(self._pending[v][1] for v in done)
            for v in done:
                del self._pending[v]
        return sent, full
