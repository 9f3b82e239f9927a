"""Weight publication off the learner's critical path (ParaBlock's communication–computation overlap).

Weights travel through one interface whatever the codec: the learner publishes versions into a
`heterorl.weights.WeightStore` (full snapshots or PULSE patches, per `weights.codec`); a sampler's
`WeightReceiver` applies the `Update` the store builds for the version it holds. `BackgroundPublisher` runs the
publish (cast, diff, encode, hash) in a worker thread so the next learner step starts at once; whoever needs
the new version (the sends to samplers) waits for it with `result()`.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from heterorl.config import WeightsConfig
from heterorl.weights import Published, WeightStore


class BackgroundPublisher:
    """Publishes into a WeightStore in one worker thread (or inline when `overlap` is False)."""

    def __init__(self, cfg: WeightsConfig) -> None:
        self.store = WeightStore.from_config(cfg)
        self.overlap = cfg.overlap
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish") if cfg.overlap else None
        self._pending: Future[Published] | None = None
        self._last: Published | None = None

    def submit(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Start publishing `version`; `weights` must not be modified afterwards (pass a copy)."""
        self.result()  # versions are published in order
        if self._pool is None:
            self._last = self.store.publish(version, weights)
        else:
            self._pending = self._pool.submit(self.store.publish, version, weights)

    def result(self) -> Published | None:
        """The newest publication, once complete (waits for a pending one)."""
        if self._pending is not None:
            self._last, self._pending = self._pending.result(), None
        return self._last

    def close(self) -> None:
        self.result()
        if self._pool is not None:
            self._pool.shutdown()
