"""The transport interface: one side for the sampler, one for the learner, whatever carries the conversation
(`loop.protocol`, bytes in `transport.wire`). Three implementations: the simulated link (`transport.simulated`,
virtual time), HTTP (`transport.http`) and an object store (`transport.store`); a new transport is one module per
side plus its config entry (`transport.registry`).

Sampler side -- called on the node's thread; every callback comes back on it (`node.runtime`):
- `exchange(upload, done)`: carry one upload to the learner; `done(reply)` with its answer, or `done(None)` when
  the transport gave up on it for good (the link stayed down past `live.patience_s`). Several uploads may be in
  flight at once; the transport retries a lost one with the same bytes (the conversation is idempotent).
- `pull(held, wait_s, done)`: ask for weights newer than `held()` = (version, hash) (None, None: a snapshot),
  read when the request goes out;
  `done(update)` with an update envelope's bytes (or an in-process update in the simulator), None when nothing
  newer came within `wait_s`, or FINISHED when the run is over.
- `close()`; `counts`: what it counted (retries, link down/up, store faults).

Learner side -- it serves a `LearnerPort` (the learner loop and its run state) to samplers:
- `start()` once the first version is published; `published(version)` after each publication (wake waiting
  pulls, upload the version's objects); `close()` after the last step, once samplers were told it is finished.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from heterorl.loop.protocol import Reply, Upload

FINISHED = "finished"

Held = tuple[int | None, str | None]
PullDone = Callable[[Any], None]  # bytes | in-process update | None | FINISHED


class SamplerSide(Protocol):
    counts: Counter[str]

    def exchange(self, upload: Upload, done: Callable[[Reply | None], None]) -> None: ...

    def pull(self, held: Callable[[], Held], wait_s: float, done: PullDone) -> None: ...

    def close(self) -> None: ...


class LiveSamplerSide(SamplerSide, Protocol):
    """A sampler side on the wall clock (HTTP, store): the first error that must end the sampler (unreachable,
    credential refused) fails `failed`; `settle` lets answers already on their way arrive."""

    failed: Any  # asyncio.Future[None]

    async def settle(self, timeout: float) -> None: ...


class LearnerPort(Protocol):
    """What a transport's learner side serves: the learner loop's conversation and weights, and the run's state."""

    finished: bool

    def exchange(self, upload: Upload) -> Reply: ...

    def update_for(self, version: int | None, state_hash: str | None) -> Any: ...

    def heard(self, sampler: str, version: int | None, idle: float | None, failed: int | None) -> None: ...


class LearnerSide(Protocol):
    def start(self) -> None: ...

    def published(self, version: int) -> None: ...

    def close(self) -> None: ...


class Split:
    """Uploads through one transport and weights through another (`transport.rollouts` / `transport.weights`)."""

    def __init__(self, uploads: Any, weights: Any) -> None:
        self.uploads, self.weights = uploads, weights
        self.failed = _first_failure(uploads, weights)

    @property
    def counts(self) -> Counter[str]:
        return Counter(self.uploads.counts) + Counter(self.weights.counts)

    def exchange(self, upload: Upload, done: Callable[[Reply | None], None]) -> None:
        self.uploads.exchange(upload, done)

    def pull(self, held: Callable[[], Held], wait_s: float, done: PullDone) -> None:
        self.weights.pull(held, wait_s, done)

    async def settle(self, timeout: float) -> None:
        await self.uploads.settle(timeout)

    def close(self) -> None:
        self.uploads.close()
        self.weights.close()


def _first_failure(*sides: Any) -> Any:
    """A future that fails with the first failure of either live side."""
    import asyncio

    failed = asyncio.get_running_loop().create_future()

    def relay(f: Any) -> None:
        if not failed.done() and not f.cancelled() and f.exception() is not None:
            failed.set_exception(f.exception())

    for side in sides:
        side.failed.add_done_callback(relay)
    return failed
