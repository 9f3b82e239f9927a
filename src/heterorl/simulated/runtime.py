"""A node's runtime on the simulated clock: virtual time from the event loop, work done at once.

Generation runs for real and is paced in virtual time at the node's `tokens_per_second`: the engine's decoding
steps run in rounds, every running generation advancing by one step per round, and a round lasts the tokens it
produced divided by the speed (several generations on one engine share its speed, as continuous batching does).
A generation that nothing can interrupt and that runs alone is computed whole and finishes at
`start + tokens / speed`, without an event per step.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from heterorl.loop.worker import SamplerWorker
from heterorl.node.runtime import GenerationDone
from heterorl.policy import run_process
from heterorl.rollout import RolloutGroup
from heterorl.simulated.events import EventLoop


@dataclass
class _Running:
    process: Generator[int, None, list[RolloutGroup]]
    done: GenerationDone
    tokens: int = 0  # sampled so far
    busy: float = 0.0


class VirtualRuntime:
    """One node's runtime on a shared `EventLoop`."""

    def __init__(self, events: EventLoop, tokens_per_second: float, label: str) -> None:
        self.events, self.speed, self.label = events, tokens_per_second, label
        self.running: list[_Running] = []
        self.round_scheduled = False

    def now(self) -> float:
        return self.events.now

    def call_later(self, seconds: float, callback: Callable[[], None]) -> None:
        self.events.schedule_in(seconds, callback, label=f"{self.label} timer")

    def run_blocking(self, work: Callable[[], Any], done: Callable[[Any], None]) -> None:
        result = work()
        self.events.schedule_in(0.0, done, result, label=f"{self.label} work done")

    def generate(self, worker: SamplerWorker, n: int, load: bool, done: GenerationDone) -> None:
        process = worker.generate(n, load)
        if not worker.interruptible and not self.running and not self.round_scheduled:
            groups = run_process(process)
            busy = sum(g.num_tokens for g in groups) / self.speed
            self.events.schedule_in(busy, done, groups, busy, label=f"{self.label} done")
            return
        self.running.append(_Running(process, done))
        if not self.round_scheduled:
            self.round_scheduled = True
            self.events.schedule_in(0.0, self._round, label=f"{self.label} decode")

    def _round(self) -> None:
        """One decoding step of every running generation; the next round when its tokens are done."""
        self.round_scheduled = False
        produced = 0
        finished: list[tuple[_Running, list[RolloutGroup]]] = []
        for run in self.running:
            try:
                tokens = next(run.process)
            except StopIteration as end:
                finished.append((run, end.value))
                continue
            produced += tokens - run.tokens
            run.tokens = tokens
        seconds = produced / self.speed
        for run in self.running:
            run.busy += seconds / max(len(self.running), 1)
        self.running = [r for r in self.running if all(r is not f for f, _ in finished)]
        for run, groups in finished:
            self.events.schedule_in(0.0, run.done, groups, run.busy, label=f"{self.label} done")
        if self.running:
            self.round_scheduled = True
            self.events.schedule_in(seconds, self._round, label=f"{self.label} decode")
