"""A node's runtime on the wall clock: an asyncio loop for timers and callbacks, a generation thread for the
engine, and a worker thread for CPU work (decoding and applying weight updates, which then overlap generation).

The generation thread steps every running generation once per round (an engine that batches continuously, such as
vLLM, then advances them together; with one generation at a time this is simply running it). Results and errors
come back to the asyncio loop; an error in either thread ends the node (`failed`).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from heterorl.loop.worker import SamplerWorker
from heterorl.node.runtime import GenerationDone
from heterorl.rollout import RolloutGroup


@dataclass
class _Job:
    worker: SamplerWorker
    n: int
    load: bool
    done: GenerationDone
    process: Generator[int, None, list[RolloutGroup]] | None = None
    busy: float = 0.0


class WallRuntime:
    """The runtime of one live sampler process (create it inside the running asyncio loop)."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.failed: asyncio.Future[None] = self.loop.create_future()  # set with the first error of a thread
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weights")
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._generation_thread, name="generate", daemon=True)
        self._thread.start()

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, seconds: float, callback: Callable[[], None]) -> None:
        self.loop.call_later(seconds, callback)

    def run_blocking(self, work: Callable[[], Any], done: Callable[[Any], None]) -> None:
        future = self.loop.run_in_executor(self._pool, work)

        def finished(f: asyncio.Future[Any]) -> None:
            if f.cancelled():
                return
            if f.exception() is not None:
                self._fail(f.exception())
                return
            done(f.result())

        future.add_done_callback(finished)

    def generate(self, worker: SamplerWorker, n: int, load: bool, done: GenerationDone) -> None:
        self._jobs.put(_Job(worker, n, load, done))

    def close(self) -> None:
        """Stop the threads (a generation in progress finishes its current step first)."""
        self._jobs.put(None)
        self._thread.join(timeout=60.0)
        self._pool.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------------ threads
    def _fail(self, error: BaseException | None) -> None:
        if error is not None and not self.failed.done():
            self.failed.set_exception(error)

    def _generation_thread(self) -> None:
        running: list[_Job] = []
        while True:
            if not running:  # nothing to step: wait for a job
                job = self._jobs.get()
                if job is None:
                    return
                running.append(job)
            while True:  # and take every job queued meanwhile before the next round
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    return
                running.append(job)
            try:
                running = self._round(running)
            except BaseException as err:  # an engine error: the node cannot go on
                self.loop.call_soon_threadsafe(self._fail, err)
                return

    def _round(self, running: list[_Job]) -> list[_Job]:
        still = []
        for job in running:
            began = time.monotonic()
            if job.process is None:
                job.process = job.worker.generate(job.n, job.load)
            try:
                next(job.process)
            except StopIteration as end:
                job.busy += time.monotonic() - began
                self.loop.call_soon_threadsafe(job.done, end.value, job.busy)
                continue
            job.busy += time.monotonic() - began
            still.append(job)
        return still
