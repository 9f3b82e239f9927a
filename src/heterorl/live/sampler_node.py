"""`heterorl sampler`: one sampler process of the live cluster, connected out to the learner service.

Three concurrent activities on one event loop:
- pull: long-polls GET /v1/weights with the (version, hash) it holds; applies each update with a
  `WeightReceiver` (which rejects a corrupt or mismatched update, after which the next pull asks for a
  snapshot) and re-hashes the result, logging the verified hash (`weights` events);
- generate (a worker thread, torch): `ceil(groups_per_step / n_samplers)` groups at a time with the newest
  weights held (async mode), or exactly its share once per new version (sync mode, replacing groups the learner
  rejected or the link lost); with `sampler.interruptible`, newer weights are loaded between decoding steps;
- push: POSTs each group (same bytes on every retry, so the learner deduplicates), logging the outcome.
The outbox holds at most one chunk, so a sampler whose pushes stall (learner away, queue full) stops generating.

Group ids are `<sampler>:<n>@<boot id>`; the random boot id keeps them unique across restarts of the process.
Stops when the learner says the run is finished (410).
"""

from __future__ import annotations

import asyncio
import math
import random
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from heterorl.config import RunConfig
from heterorl.live.eventlog import EventLog
from heterorl.live.preflight import LiveSetupError, check_live_config, node_name
from heterorl.loop.intake import body_digest
from heterorl.policy import Policy, SamplingParams, run_process
from heterorl.rollout import RolloutGroup
from heterorl.rollout_codec import encode_group
from heterorl.run import sampler_seed
from heterorl.sampler import Sampler
from heterorl.tasks import make_task
from heterorl.transport.envelope import EnvelopeError, decode_update
from heterorl.transport.http.auth import configured_token
from heterorl.transport.http.client import FINISHED, Backoff, LearnerClient, LinkEmulator
from heterorl.weights import WeightReceiver, state_hash

_ACKED = ("accepted", "duplicate")


class LiveSampler:
    """One sampler's pull / generate / push loops (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        index: int,
        sampler: Sampler,
        client: LearnerClient,
        link: LinkEmulator,
        events: EventLog,
        boot: str,
    ) -> None:
        self.cfg, self.index, self.sampler, self.boot = cfg, index, sampler, boot
        self.client, self.link, self.events = client, link, events
        self.receiver = WeightReceiver()
        self.lock = threading.Lock()  # the receiver's weights and the sampler's parameters
        self.loaded: tuple[int, str] | None = None
        n, B = len(cfg.cluster.samplers), cfg.learner.groups_per_step
        self.chunk = math.ceil(B / n)
        self.share = B // n + (1 if index < B % n else 0)  # sync mode: its even share of a batch
        self.started = time.monotonic()
        self.busy_seconds = 0.0
        self.counts: Counter[str] = Counter()
        rng = random.Random(sampler_seed(cfg.seed, index) + 1)  # the client's retries use the node seed itself
        self.retry = Backoff(cfg.live.backoff_initial_s, cfg.live.backoff_max_s, rng)
        self.gen_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")
        self.finished = asyncio.Event()
        self.changed = asyncio.Event()  # replaced after every set: wakes whoever waits for new weights
        self.outbox: asyncio.Queue[tuple[str, bytes, asyncio.Future[str]]] = asyncio.Queue(maxsize=self.chunk)

    # ---------------------------------------------------------------- running
    async def run(self) -> dict[str, Any]:
        """Pull, generate and push until the learner says the run is finished; returns the push outcomes."""
        tasks = [asyncio.create_task(c) for c in (self._pull_loop(), self._push_loop(), self._generate_loop())]
        done_waiter = asyncio.create_task(self.finished.wait())
        try:
            done, _ = await asyncio.wait([*tasks, done_waiter], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # re-raise a loop's error (learner unreachable, token refused)
        finally:
            for task in [*tasks, done_waiter]:
                task.cancel()
            await asyncio.gather(*tasks, done_waiter, return_exceptions=True)
            self.gen_pool.shutdown(wait=True, cancel_futures=True)
        result = {"sampler": self.sampler.sampler_id, "boot": self.boot, "version": self.receiver.version}
        self.events.emit("finished", **result, outcomes=dict(self.counts), idle=round(self.idle(), 4))
        return {**result, "outcomes": dict(self.counts)}

    def idle(self) -> float:
        return 1.0 - self.busy_seconds / max(time.monotonic() - self.started, 1e-9)

    def _held(self) -> tuple[int | None, str | None]:
        return self.receiver.version, self.receiver.state_hash

    def _holds_other_than(self, key: tuple[int | None, str | None]) -> Callable[[], bool]:
        return lambda: self._held() != key

    def _signal(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    async def _wait_until(self, condition: Callable[[], bool]) -> bool:
        """Wait for new weights (or the end) until `condition()`; False when the run finished first."""
        while not condition():
            if self.finished.is_set():
                return False
            await self.changed.wait()
        return not self.finished.is_set()

    # ---------------------------------------------------------------- weights
    async def _pull_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.finished.is_set():
            version, held_hash = self.receiver.held()
            wait = self.cfg.live.poll_seconds if version is not None else 0.0
            got = await self.client.pull(version, held_hash, wait, self.idle())
            if got == FINISHED:
                self.finished.set()
                self._signal()
                return
            if got is None:
                if wait <= 0.0:
                    await asyncio.sleep(self.cfg.live.backoff_initial_s)
                continue
            assert isinstance(got, bytes)
            applied = False
            for payload in await self.link.inbound(got):
                applied |= await loop.run_in_executor(None, self._apply, payload)
            if applied:
                self.retry.reset()
                self._signal()
            else:  # lost or refused: ask again, without hammering the learner
                await asyncio.sleep(self.retry.next_delay())

    def _apply(self, payload: bytes) -> bool:
        """Apply one update envelope to the receiver; verify the resulting weights' hash independently."""
        try:
            update = decode_update(payload)
        except EnvelopeError as err:
            self.events.emit("weights", ok=False, error=f"envelope: {err}"[:300], bytes=len(payload))
            return False
        with self.lock:
            if (update.version, update.state_hash) == self._held() and not self.receiver.needs_snapshot:
                return False  # a duplicated delivery of what it already holds
            ok = self.receiver.apply(update)
            error = self.receiver.last_error
            if ok and state_hash(self.receiver.weights or {}) != self.receiver.state_hash:
                ok, error = False, "hash of the applied weights differs from the update's"
                self.receiver.needs_snapshot = True
            version, held_hash = self._held()
        self.events.emit(
            "weights", ok=ok, version=version, hash=held_hash, kind=update.kind, bytes=len(payload), error=error
        )
        return ok

    def _load_newest(self) -> None:
        """Copy the receiver's weights into the sampler's model if they are newer than what it computes with."""
        with self.lock:
            key = self._held()
            if key[0] is not None and key != self.loaded and self.receiver.weights is not None:
                self.sampler.load_weights(key[0], self.receiver.weights)
                self.loaded = (key[0], key[1] or "")

    # ---------------------------------------------------------------- generation
    def _generate(self, n: int) -> list[RolloutGroup]:
        """n groups with the newest weights (thread); between decoding steps too when interruptible."""
        began, wall = time.monotonic(), time.time()
        self._load_newest()
        process = self.sampler.iter_groups(n)
        if self.cfg.sampler.interruptible:
            while True:
                try:
                    next(process)
                except StopIteration as end:
                    groups: list[RolloutGroup] = end.value
                    break
                self._load_newest()
        else:
            groups = run_process(process)
        self.busy_seconds += time.monotonic() - began
        for g in groups:
            g.group_id = f"{g.group_id}@{self.boot}"
            g.created_at, g.finished_at = wall, time.time()
        self.events.emit(
            "generated", n=len(groups), version=self.sampler.version, seconds=round(time.monotonic() - began, 3)
        )
        return groups

    async def _enqueue(self, group: RolloutGroup) -> asyncio.Future[str]:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        await self.outbox.put((group.group_id, encode_group(group), future))
        return future

    async def _generate_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if not await self._wait_until(lambda: self.receiver.version is not None):
            return
        if self.cfg.cluster.mode == "async":
            while not self.finished.is_set():
                for g in await loop.run_in_executor(self.gen_pool, self._generate, self.chunk):
                    await self._enqueue(g)
            return
        last: tuple[int | None, str | None] = (None, None)
        while await self._wait_until(self._holds_other_than(last)):
            key, need = self._held(), self.share
            while need > 0 and self._held() == key and not self.finished.is_set():
                groups = await loop.run_in_executor(self.gen_pool, self._generate, need)
                outcomes = await asyncio.gather(*[await self._enqueue(g) for g in groups])
                need -= sum(o in _ACKED for o in outcomes)
            last = key

    # ---------------------------------------------------------------- rollouts
    async def _push_loop(self) -> None:
        while True:
            group_id, payload, future = await self.outbox.get()
            digest = body_digest(payload)  # of the bytes as generated: corruption on the way is detected
            outcomes = [await self.client.push(p, digest) for p in await self.link.outbound(payload)]
            outcome = next((o for o in _ACKED if o in outcomes), outcomes[-1] if outcomes else "dropped")
            self.counts[outcome] += 1
            self.events.emit("pushed", group_id=group_id, outcome=outcome)
            if not future.done():
                future.set_result(outcome)
            if outcome == FINISHED:
                self.finished.set()
                self._signal()
                return


def sampler_policy(cfg: RunConfig) -> Policy:
    """The sampler's model: `model.path`, or the architecture built from the config (its weights arrive as a
    snapshot from the learner, so a sampler host never needs the learner's warm start)."""
    return Policy.from_config(cfg.model, seed=cfg.seed)


async def _connect_and_run(cfg: RunConfig, url: str, token: str, index: int, sampler: Sampler) -> dict[str, Any]:
    boot = secrets.token_hex(6)
    events = EventLog(sampler=sampler.sampler_id, boot=boot)
    rng = random.Random(sampler_seed(cfg.seed, index))
    async with LearnerClient(url, token, cfg.live, sampler.sampler_id, rng, events) as client:
        status = await client.status()
        events.emit("started", url=url, learner_version=status.get("version"), finished=status.get("finished"))
        if status.get("finished"):
            return {"sampler": sampler.sampler_id, "boot": boot, "version": None, "outcomes": {}}
        link = LinkEmulator(cfg.cluster.samplers[index].link if cfg.live.emulate_links else None, cfg.seed, index)
        return await LiveSampler(cfg, index, sampler, client, link, events, boot).run()


def run_sampler(cfg: RunConfig, connect: str, index: int = 0) -> dict[str, Any]:
    """Run sampler node `index` of `cfg` against the learner at `connect` until the run is finished."""
    check_live_config(cfg)
    name = node_name(cfg, index)
    token = configured_token(cfg.live)
    if token is None:
        raise LiveSetupError(f"no token: set ${cfg.live.token_env} (or live.token_file) to the learner's token")
    seed = sampler_seed(cfg.seed, index)
    torch.manual_seed(seed)
    sampler = Sampler.from_policy(
        name,
        sampler_policy(cfg),
        make_task(cfg.task),
        SamplingParams.from_config(cfg.sampler),
        cfg.sampler.group_size,
        seed=seed,
    )
    return asyncio.run(_connect_and_run(cfg, connect, token, index, sampler))
