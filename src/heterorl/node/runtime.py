"""What a node needs of its clock: the time, timers, and where work runs. Two implementations: virtual time in the
simulator (`simulated.runtime`), the wall clock with an asyncio loop and worker threads live (`live.runtime`).

Callbacks always run on the node's own thread (the simulator's event loop, the live process's asyncio loop), one at
a time, so a session is never touched by two threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from heterorl.loop.worker import SamplerWorker
from heterorl.rollout import RolloutGroup

GenerationDone = Callable[[list[RolloutGroup], float], None]  # (groups, seconds the engine was busy with them)


class Runtime(Protocol):
    def now(self) -> float:
        """Seconds on this clock (any origin)."""

    def call_later(self, seconds: float, callback: Callable[[], None]) -> None:
        """Run `callback` after `seconds`."""

    def run_blocking(self, work: Callable[[], Any], done: Callable[[Any], None]) -> None:
        """Run CPU work (decoding and applying a weight update), then `done(result)`."""

    def generate(self, worker: SamplerWorker, n: int, load: bool, done: GenerationDone) -> None:
        """Generate n groups with the worker's newest weights (`load`: load them first), then `done(groups, busy)`;
        several generations may run at once on an engine that batches continuously."""
