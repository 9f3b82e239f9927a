"""`heterorl sampler`: a sampler worker (`heterorl.loop.sampler_loop`) driven on the wall clock, connected out to
the learner service or to an object store (`transport:` in the config; transport/base.py is the interface).

Three concurrent activities on one event loop:
- pull: asks the weight source (a long-poll of GET /v1/weights, or the store's manifest) with the (version, hash)
  it holds and hands each update to the worker, which applies it hash-checked or refuses it (then the next pull
  asks for a snapshot);
- generate (a worker thread, torch): `worker.wants()` groups at a time — a chunk in async mode (after the
  learner's admission when `cluster.eta` is set), its share of each new version in sync mode, generating again
  what the learner did not acknowledge; with `sampler.interruptible` newer weights load between decoding steps;
- push: sends each group (same bytes on every retry, so the learner de-duplicates) and reports the learner's
  verdict; over HTTP one at a time, through a store up to `max_pending_groups` await theirs at once.
The outbox holds at most one chunk, so a sampler whose pushes stall (learner away, queue full) stops generating.

Group ids are `<sampler>:<n>@<boot id>`; the random boot id keeps them unique across restarts of the process.
Stops when the learner says the run is finished (410, or the store's `finished` marker).
"""

from __future__ import annotations

import asyncio
import random
import secrets
import time
from collections import Counter
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from heterorl.config import RunConfig
from heterorl.eventlog import EventLog
from heterorl.live.preflight import LiveSetupError, check_live_config, check_node_index, check_url
from heterorl.live.transports import check_transport_config, sampler_needs_http, sampler_transport, store_counts
from heterorl.loop.intake import ACKED, body_digest
from heterorl.loop.sampler_loop import SamplerWorker
from heterorl.policy import run_process
from heterorl.rollout import RolloutGroup
from heterorl.rollout_codec import encode_group
from heterorl.run.build import build_sampler, configure_torch, sampler_seed
from heterorl.transport.base import SamplerTransport
from heterorl.transport.emulation import LinkEmulator
from heterorl.transport.http.auth import configured_token
from heterorl.transport.http.client import FINISHED, FINISHED_WAIT, Backoff, LearnerClient
from heterorl.transport.http.sink import http_transport
from heterorl.weights.envelope import EnvelopeError, decode_update

SETTLE_AFTER_FINISH_S = 5.0  # how long a finished sampler waits for the verdicts of groups it already sent


@dataclass
class _Chunk:
    """One chunk being generated (a `SamplerWorker.generate` process) and when it started."""

    process: Generator[int, None, list[RolloutGroup]]
    began: float
    wall: float
    groups: list[RolloutGroup] | None = None

    def step(self) -> None:
        try:
            next(self.process)
        except StopIteration as end:
            self.groups = end.value


class LiveSampler:
    """One sampler's pull / generate / push loops around its worker (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        worker: SamplerWorker,
        transport: SamplerTransport | LearnerClient,
        link: LinkEmulator,
        events: EventLog,
        boot: str,
    ) -> None:
        if isinstance(transport, LearnerClient):
            transport = http_transport(transport)
        self.cfg, self.worker, self.transport, self.link, self.events = cfg, worker, transport, link, events
        self.boot = boot
        cc = cfg.cluster  # AReaL's eta and backpressure are asked of the learner (over HTTP) before each chunk
        wanted = cc.mode == "async" and (cc.eta is not None or cc.max_queued_steps is not None)
        self.admission = transport.admission if wanted and transport is not None else None  # None: receive only
        self.started = time.monotonic()
        self.busy_seconds = 0.0
        self.counts: Counter[str] = Counter()
        self.settling: set[asyncio.Task[None]] = set()  # groups sent, awaiting the learner's verdict
        rng = random.Random(sampler_seed(cfg.seed, worker.index) + 1)  # the client's retries use the node seed
        self.retry = Backoff(cfg.live.backoff_initial_s, cfg.live.backoff_max_s, rng)
        self.gen_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")
        self.finished = asyncio.Event()
        self.changed = asyncio.Event()  # replaced after every set: wakes whoever waits for weights or answers
        self.outbox: asyncio.Queue[tuple[RolloutGroup, bytes, asyncio.Future[str]]] = asyncio.Queue(
            maxsize=worker.chunk
        )

    # ---------------------------------------------------------------- running
    async def run(self) -> dict[str, Any]:
        """Pull, generate and push until the learner says the run is finished; returns the push outcomes."""
        tasks = [asyncio.create_task(c) for c in (self._pull_loop(), self._push_loop(), self._generate_loop())]
        done_waiter = asyncio.create_task(self.finished.wait())
        try:
            done, _ = await asyncio.wait([*tasks, done_waiter], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # re-raise a loop's error (learner unreachable, token refused)
            if self.settling:  # the run is over: let verdicts already on their way settle, so the counts are whole
                await asyncio.wait(self.settling, timeout=SETTLE_AFTER_FINISH_S)
        finally:
            for task in [*tasks, done_waiter]:
                task.cancel()
            await asyncio.gather(*tasks, done_waiter, return_exceptions=True)
            self.gen_pool.shutdown(wait=True, cancel_futures=True)
        result = {"sampler": self.worker.name, "boot": self.boot, "version": self.worker.receiver.version}
        w = self.worker
        updates = {"applied": w.applied, "failed": w.failed, "ignored": w.ignored}
        self.events.emit("finished", **result, outcomes=dict(self.counts), updates=updates, idle=round(self.idle(), 4))
        return {**result, "outcomes": dict(self.counts), "updates": updates}

    def idle(self) -> float:
        return 1.0 - self.busy_seconds / max(time.monotonic() - self.started, 1e-9)

    def _signal(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def _finish(self) -> None:
        self.finished.set()
        self._signal()

    # ---------------------------------------------------------------- weights
    async def _pull_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.finished.is_set():
            version, held_hash = self.worker.held()
            wait = self.cfg.live.poll_seconds if version is not None else 0.0
            got = await self.transport.weights.pull(version, held_hash, wait, self.idle(), self.worker.failed)
            if got == FINISHED:
                self._finish()
                return
            if got is None:
                if wait <= 0.0:
                    await asyncio.sleep(self.cfg.live.backoff_initial_s)
                continue
            assert isinstance(got, bytes)
            applied = False
            for payload in await self.link.inbound(got):
                applied |= await loop.run_in_executor(None, self._receive, payload)
            if applied:
                self.retry.reset()
                self._signal()
            else:  # lost or refused: ask again, without hammering the learner
                await asyncio.sleep(self.retry.next_delay())

    def _receive(self, payload: bytes) -> bool:
        """Decode one update envelope and hand it to the worker; log what it holds afterwards."""
        failed_before = self.worker.failed
        try:
            update = decode_update(payload)
        except EnvelopeError as err:  # the only error decode_update raises, whatever the bytes
            self.worker.refused(f"envelope: {err}")
            self.events.emit("weights", ok=False, error=f"envelope: {err}"[:300], bytes=len(payload))
            return False
        ok = self.worker.receive(update)
        if ok or self.worker.failed != failed_before:
            version, held_hash = self.worker.held()
            error = None if ok else self.worker.last_error
            self.events.emit(
                "weights", ok=ok, version=version, hash=held_hash, kind=update.kind, bytes=len(payload), error=error
            )
        return ok

    # ---------------------------------------------------------------- generation
    def _wants(self) -> int:
        return self.worker.wants()  # loads the newest weights first (torch: runs in the generation thread)

    def _generate(self, n: int) -> list[RolloutGroup]:
        """n groups with the newest weights (thread); the worker loads newer ones mid-way when interruptible."""
        began, wall = time.monotonic(), time.time()
        groups = run_process(self.worker.generate(n))
        self.busy_seconds += time.monotonic() - began
        return self._finished_chunk(groups, began, wall, in_flight=1)

    def _finished_chunk(
        self, groups: list[RolloutGroup], began: float, wall: float, in_flight: int
    ) -> list[RolloutGroup]:
        for g in groups:
            g.group_id = f"{g.group_id}@{self.boot}"
            g.created_at, g.finished_at = wall, time.time()
        seconds = round(time.monotonic() - began, 3)
        self.events.emit("generated", n=len(groups), version=self.worker.version, seconds=seconds, in_flight=in_flight)
        return groups

    # continuous batching: several chunks in flight on one engine (thread-side helpers, all in the generation thread)
    def _wants_now(self, running: int) -> int:
        """Like `_wants`, but a non-interruptible rollout takes new weights only once nothing is in flight."""
        return self.worker.wants(load=running == 0 or self.worker.interruptible)

    def _start(self, n: int) -> _Chunk:
        chunk = _Chunk(self.worker.generate(n), time.monotonic(), time.time())
        chunk.step()  # submit it: it joins the engine's running batch
        return chunk

    def _step_all(self, running: list[_Chunk]) -> list[RolloutGroup]:
        """Advance every chunk in flight by one engine step; the groups of those that finished."""
        began = time.monotonic()
        done: list[RolloutGroup] = []
        for chunk in running:
            if chunk.groups is None:
                chunk.step()
            if chunk.groups is not None:
                done += self._finished_chunk(chunk.groups, chunk.began, chunk.wall, in_flight=len(running))
        running[:] = [c for c in running if c.groups is None]
        self.busy_seconds += time.monotonic() - began
        return done

    async def _wait_for_change(self) -> None:
        if not self.finished.is_set():
            await self.changed.wait()

    async def _admitted(self, n: int) -> bool | None:
        """Ask the learner's admission (when configured): True granted, False wait, None the run is finished."""
        if self.admission is None:
            return True
        wait = await self.admission.admit(n, self.worker.version)
        if wait == FINISHED_WAIT:
            self._finish()
            return None
        if wait is not None:
            await asyncio.wait([asyncio.create_task(self._wait_for_change())], timeout=wait)
            return False
        return True

    async def _generate_continuously(self, limit: int) -> None:
        """Async mode on an engine that batches continuously (vLLM): up to `limit` chunks in flight; a new chunk
        joins the running batch as soon as the learner admits it, instead of waiting for the previous one to end."""
        loop = asyncio.get_running_loop()
        running: list[_Chunk] = []
        while not self.finished.is_set():
            while len(running) < limit:
                n = await loop.run_in_executor(self.gen_pool, self._wants_now, len(running))
                if n == 0:
                    break
                admitted = await self._admitted(n)
                if admitted is None:
                    return
                if not admitted:
                    break
                running.append(await loop.run_in_executor(self.gen_pool, self._start, n))
            if not running:
                await asyncio.wait([asyncio.create_task(self._wait_for_change())], timeout=1.0)
                continue
            for group in await loop.run_in_executor(self.gen_pool, self._step_all, running):
                await self._enqueue(group)

    async def _generate_loop(self) -> None:
        limit = self.worker.sampler.engine.chunks_in_flight
        if not self.worker.sync and limit > 1:
            await self._generate_continuously(limit)
            return
        loop = asyncio.get_running_loop()
        while not self.finished.is_set():
            n = await loop.run_in_executor(self.gen_pool, self._wants)
            if n == 0:
                await self._wait_for_change()  # new weights, or (sync mode) an answer that asks for more
                continue
            admitted = await self._admitted(n)
            if admitted is None:
                return
            if not admitted:
                continue
            groups = await loop.run_in_executor(self.gen_pool, self._generate, n)
            answers = [await self._enqueue(g) for g in groups]
            if self.worker.sync:
                await asyncio.gather(*answers)  # the share is complete only once the learner has answered

    async def _enqueue(self, group: RolloutGroup) -> asyncio.Future[str]:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        await self.outbox.put((group, encode_group(group), future))
        return future

    # ---------------------------------------------------------------- rollouts
    async def _push_loop(self) -> None:
        """Send groups in order; settle each with the learner's verdict. At most `max_in_flight` groups await a
        verdict at once (HTTP: 1, so each POST is answered before the next goes out)."""
        settling = self.settling
        limit = self.transport.rollouts.max_in_flight
        while not self.finished.is_set():
            group, payload, future = await self.outbox.get()
            digest = body_digest(payload)  # of the bytes as generated: corruption on the way is detected
            verdicts = [await self.transport.rollouts.send(p, digest) for p in await self.link.outbound(payload)]
            settling.add(asyncio.create_task(self._settle(group, verdicts, future)))
            while settling and (len(settling) >= limit or any(t.done() for t in settling)):
                done, _ = await asyncio.wait(settling, return_when=asyncio.FIRST_COMPLETED)
                settling -= done
                for task in done:
                    task.result()  # a transport that gave up raises here

    async def _settle(self, group: RolloutGroup, verdicts: list, future: asyncio.Future[str]) -> None:
        outcomes = [await v for v in verdicts]
        outcome = next((o for o in ACKED if o in outcomes), outcomes[-1] if outcomes else "dropped")
        self.counts[outcome] += 1
        self.worker.delivered(group, outcome)
        self.events.emit("pushed", group_id=group.group_id, outcome=outcome)
        if not future.done():
            future.set_result(outcome)
        self._signal()
        if outcome == FINISHED:
            self._finish()


async def _connect_and_run(cfg: RunConfig, url: str | None, token: str | None, worker: SamplerWorker) -> dict[str, Any]:
    boot = secrets.token_hex(6)
    events = EventLog(sampler=worker.name, boot=boot)
    seed = sampler_seed(cfg.seed, worker.index)
    async with sampler_transport(cfg, worker.name, url, token, seed, events, boot) as transport:
        learner_version = None
        if isinstance(transport.weights, LearnerClient) or isinstance(transport.admission, LearnerClient):
            client = transport.weights if isinstance(transport.weights, LearnerClient) else transport.admission
            assert isinstance(client, LearnerClient)
            status = await client.status()
            learner_version = status.get("version")
            if status.get("finished"):
                events.emit("started", url=url, learner_version=learner_version, finished=True)
                return {"sampler": worker.name, "boot": boot, "version": None, "outcomes": {}}
        events.emit("started", url=url, store=cfg.transport.store.url, learner_version=learner_version, finished=False)
        index = worker.index
        link = LinkEmulator(cfg.cluster.samplers[index].link if cfg.live.emulate_links else None, cfg.seed, index)
        result = await LiveSampler(cfg, worker, transport, link, events, boot).run()
        counts = store_counts(transport)
        if counts:
            events.emit("store_counts", **counts)
        return {**result, "store": counts}


def run_sampler(cfg: RunConfig, connect: str | None, index: int = 0) -> dict[str, Any]:
    """Run sampler node `index` of `cfg` until the run is finished: against the learner at `connect` and/or the
    configured store (`connect` may be None when nothing travels over HTTP and `cluster.eta` is unset)."""
    check_live_config(cfg)
    check_node_index(cfg, index)
    check_transport_config(cfg)
    why = sampler_needs_http(cfg)
    token = None
    if why is not None:
        if not connect:
            raise LiveSetupError(f"the sampler needs the learner's URL (--connect) because {why}")
        check_url(connect)
        token = configured_token(cfg.live)
        if token is None:
            raise LiveSetupError(f"no token: set ${cfg.live.token_env} (or live.token_file) to the learner's token")
    configure_torch(cfg)
    sampler = build_sampler(cfg, index, base=None)
    try:
        url = connect if why is not None else None
        return asyncio.run(_connect_and_run(cfg, url, token, SamplerWorker(cfg, index, sampler)))
    finally:
        sampler.engine.close()
