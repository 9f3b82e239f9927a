"""The simulated cluster: a discrete-event scheduler with a virtual clock driving the real Sampler and Learner.

Generation, training and weight encoding run for real; only time is modelled:
- a sampler generating n tokens is busy n / tokens_per_second virtual seconds;
- a learner step costs `learner_step_seconds + learner_seconds_per_token * tokens`;
- a message on a link takes `delay + bytes / bandwidth`; each path of a link is FIFO (one connection) and
  transmits one message at a time, so a slow patch holds back the next one as a real stream would.

Modes (both built from the same events):
- async (HeteroRL / AReaL): samplers generate continuously with whatever weights they hold; the learner trains
  whenever `groups_per_step` groups are eligible; staleness emerges from speeds and delays. Staleness control:
  the learner-side window (`max_staleness`: older groups are dropped and counted) and AReaL's admission rule
  (`eta`: a generation may start only while started - dropped + n <= (eta + v + 1) * B).
- sync: the learner publishes v, every sampler waits for v, generates its even share of the batch, the learner
  waits for all of it. The classic synchronous RL loop, paying every delay and the slowest sampler each step.

Weights are pushed: every published version is sent to every sampler as the store's smallest update from the
version it was last sent (over a FIFO path that is a PULSE patch chain, with snapshots as the store decides).
A receiver that fails to apply an update (hash mismatch, corrupt patch) is sent a snapshot next. Publishing runs
in a worker thread while the learner's next step computes; the sends happen at the same virtual instant, so the
overlap changes wall time only. With `sampler.interruptible`, a version arriving mid-generation is applied
between two tokens (generation is a suspendable process); otherwise it waits for the generation end.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field

from heterorl.config import RunConfig
from heterorl.learner import Learner
from heterorl.loop.publisher import BackgroundPublisher
from heterorl.loop.staleness import RolloutBuffer
from heterorl.network import Link, bandwidth_seconds
from heterorl.policy import run_process
from heterorl.rollout import RolloutGroup
from heterorl.rollout_codec import encode_group
from heterorl.sampler import Sampler
from heterorl.simulated.events import EventLoop
from heterorl.weights import Update, WeightReceiver


@dataclass
class _Path:
    """One direction of a link: FIFO delivery, one transmission at a time."""

    link: Link
    name: str  # "weights" | "rollout"
    free_at: float = 0.0
    last_arrival: float = 0.0
    bytes_sent: int = 0

    def send(self, now: float, nbytes: int) -> float:
        """Arrival time of a message of `nbytes` sent at `now`."""
        start = max(now, self.free_at)
        self.free_at = start + bandwidth_seconds(nbytes, self.link.cfg.bandwidth_mbps)
        delay = self.link.delays[self.name].sample(self.link.delay_rngs[self.name])
        self.last_arrival = max(self.free_at + delay, self.last_arrival)
        self.bytes_sent += nbytes
        return self.last_arrival


@dataclass
class SamplerNode:
    """A sampler machine: the real Sampler, its speed, its link, and its simulation state."""

    index: int
    sampler: Sampler
    tokens_per_second: float
    weights_path: _Path
    rollout_path: _Path
    receiver: WeightReceiver = field(default_factory=WeightReceiver)
    inbox: deque[Update] = field(default_factory=deque)
    sent: tuple[int | None, str | None] = (None, None)  # (version, hash) it will hold: the next update's base
    failed_updates: int = 0
    generating: bool = False
    started_at: float = 0.0
    busy_seconds: float = 0.0
    tokens: int = 0
    synced_for: int = -1  # sync mode: the version it last generated its share for

    @property
    def name(self) -> str:
        return self.sampler.sampler_id


class SimulatedCluster:
    """Runs `cfg.learner.steps` learner steps of the configured cluster in virtual time."""

    def __init__(
        self,
        cfg: RunConfig,
        learner: Learner,
        samplers: list[Sampler],
        on_step: Callable[[dict], None],
    ) -> None:
        cc = cfg.cluster
        if len(samplers) != len(cc.samplers):
            raise ValueError(f"{len(samplers)} samplers for {len(cc.samplers)} configured nodes")
        self.cfg, self.cc = cfg, cc
        self.learner, self.on_step = learner, on_step
        self.publisher = BackgroundPublisher(cfg.weights)
        self.loop = EventLoop()
        self.nodes = []
        for i, (s, nc) in enumerate(zip(samplers, cc.samplers, strict=True)):
            link = Link(nc.link, seed=cfg.seed, index=i)
            self.nodes.append(SamplerNode(i, s, nc.tokens_per_second, _Path(link, "weights"), _Path(link, "rollout")))
        self.B = cfg.learner.groups_per_step
        n = len(self.nodes)
        self.sync_shares = [self.B // n + (1 if i < self.B % n else 0) for i in range(n)]
        self.chunk = math.ceil(self.B / n)
        self.buffer = RolloutBuffer(cc.max_staleness)
        self.learner_busy = False
        self.learner_busy_seconds = 0.0
        self.steps_done = 0
        self.started_groups = 0
        self.admissions: list[tuple[int, int]] = []  # (groups in the admission budget, learner version) per start
        self.sync_bytes = 0
        self.sync_full_bytes = 0
        self._version_sync: dict[str, float] = {}  # sync/* metrics of the newest version's sends
        self.wall_start = time.monotonic()

    # ------------------------------------------------------------------ running
    @property
    def done(self) -> bool:
        return self.steps_done >= self.cfg.learner.steps

    def run(self) -> None:
        self._publish()
        try:
            self.loop.run_until(lambda: self.done)
        finally:
            self.publisher.close()
        if not self.done:
            raise RuntimeError("the simulation stalled: no event left before the last learner step")

    # ------------------------------------------------------------------ weights path
    def _publish(self) -> None:
        """Start publishing the learner's current version; its sends follow at the same virtual instant."""
        self.publisher.submit(self.learner.version, self.learner.export_weights())
        self.loop.schedule_in(0.0, self._send_newest, label=f"send v{self.learner.version}")

    def _send_newest(self) -> None:
        """Push the newest version to every sampler: the smallest update from what it was sent before."""
        published = self.publisher.result()
        store = self.publisher.store
        sent = 0
        for node in self.nodes:
            update = store.update_for(*node.sent)
            node.sent = (published.version, published.state_hash)
            arrival = node.weights_path.send(self.loop.now, update.nbytes)
            label = f"weights v{published.version} -> {node.name}"
            self.loop.schedule(arrival, self._weights_arrive, node, update, label=label)
            sent += update.nbytes
        full = published.numel * self.learner.wire_dtype.itemsize * len(self.nodes)  # raw wire-dtype weights
        self.sync_bytes += sent
        self.sync_full_bytes += full
        self._version_sync = {  # logged with the next learner step, tagged with the version they describe
            "sync/version": float(published.version),
            "sync/bytes": float(sent),
            "sync/full_bytes": float(full),
            "sync/changed_share": (published.changed or 0) / published.numel if published.changed is not None else 1.0,
            "time/wall_publish": published.seconds,
        }

    def _weights_arrive(self, node: SamplerNode, update: Update) -> None:
        node.inbox.append(update)
        if not node.generating or self.cfg.sampler.interruptible:
            self._apply_inbox(node)
        if not node.generating:
            self._maybe_generate(node)

    def _apply_inbox(self, node: SamplerNode) -> None:
        """Apply every queued update in order; on a failure the learner sends a snapshot next time."""
        if not node.inbox:
            return
        before = node.receiver.version
        while node.inbox:
            if not node.receiver.apply(node.inbox.popleft()):
                node.failed_updates += 1
                node.sent = (None, None)
                node.inbox.clear()
        if node.receiver.version is not None and node.receiver.version != before:
            node.sampler.load_weights(node.receiver.version, node.receiver.weights)

    # ------------------------------------------------------------------ generation
    def _admitted(self, n: int) -> bool:
        """AReaL's admission rule (async mode with eta set)."""
        if self.cc.eta is None:
            return True
        in_budget = self.started_groups - self.buffer.dropped
        return in_budget + n <= (self.cc.eta + self.learner.version + 1) * self.B

    def _maybe_generate(self, node: SamplerNode) -> None:
        if node.generating or self.done or node.sampler.version < 0:
            return
        if self.cc.mode == "sync":
            n = self.sync_shares[node.index]
            if node.sampler.version != self.learner.version or node.synced_for == self.learner.version or n == 0:
                return
            node.synced_for = self.learner.version
        else:
            n = self.chunk
            if not self._admitted(n):
                return
        self.started_groups += n
        self.admissions.append((self.started_groups - self.buffer.dropped, self.learner.version))
        node.generating, node.started_at = True, self.loop.now
        process = node.sampler.iter_groups(n)
        if self.cfg.sampler.interruptible:
            self._advance(node, process)
        else:
            groups = run_process(process)
            self._schedule_finish(node, groups)

    def _advance(self, node: SamplerNode, process: Generator[int, None, list[RolloutGroup]]) -> None:
        """Run one decoding step; resume when its tokens would be done in virtual time."""
        try:
            tokens_done = next(process)
        except StopIteration as end:
            self._schedule_finish(node, end.value)
            return
        at = node.started_at + tokens_done / node.tokens_per_second
        self.loop.schedule(max(at, self.loop.now), self._advance, node, process, label=f"{node.name} decode")

    def _schedule_finish(self, node: SamplerNode, groups: list[RolloutGroup]) -> None:
        tokens = sum(g.num_tokens for g in groups)
        at = node.started_at + tokens / node.tokens_per_second
        self.loop.schedule(max(at, self.loop.now), self._finish, node, groups, tokens, label=f"{node.name} done")

    def _finish(self, node: SamplerNode, groups: list[RolloutGroup], tokens: int) -> None:
        node.generating = False
        node.busy_seconds += self.loop.now - node.started_at
        node.tokens += tokens
        for g in groups:
            g.created_at, g.finished_at = node.started_at, self.loop.now
            arrival = node.rollout_path.send(self.loop.now, len(encode_group(g)))  # the real wire size
            self.loop.schedule(arrival, self._group_arrives, g, label=f"group {g.group_id}")
        self._apply_inbox(node)
        self._maybe_generate(node)

    # ------------------------------------------------------------------ learner
    def _group_arrives(self, group: RolloutGroup) -> None:
        self.buffer.add(group)
        self._maybe_train()

    def _maybe_train(self) -> None:
        if self.learner_busy or self.done:
            return
        dropped_before = self.buffer.dropped
        taken = self.buffer.take(self.B, self.learner.version)
        if self.buffer.dropped != dropped_before:
            self._wake_samplers()  # dropped groups free admission budget
        if taken is None:
            return
        batch, stale_stats = taken
        stats = {**self.learner.train_step(batch), **stale_stats}
        tokens = sum(g.num_tokens for g in batch)
        cost = self.cc.learner_step_seconds + self.cc.learner_seconds_per_token * tokens
        self.learner_busy = True
        self.loop.schedule_in(cost, self._train_done, stats, cost, label=f"learner step {self.steps_done + 1}")

    def _train_done(self, stats: dict, cost: float) -> None:
        self.learner_busy = False
        self.learner_busy_seconds += cost
        self.steps_done += 1
        self._publish()  # off the learner's critical path: encoding overlaps the next step (ParaBlock)
        self.on_step(self._record(stats))
        self._wake_samplers()
        self._maybe_train()

    def _wake_samplers(self) -> None:
        for node in self.nodes:
            self._maybe_generate(node)

    # ------------------------------------------------------------------ metrics
    def _record(self, stats: dict) -> dict:
        now = max(self.loop.now, 1e-12)
        record = {
            "kind": "train",
            "step": self.steps_done,
            "version": self.learner.version,
            "time/virtual": self.loop.now,
            "time/wall": time.monotonic() - self.wall_start,
            "perf/learner_idle": 1.0 - self.learner_busy_seconds / now,
            "perf/tokens_per_vsec": sum(n.tokens for n in self.nodes) / now,
            **self._version_sync,
            **stats,
        }
        for node in self.nodes:
            record[f"sampler/{node.name}/version"] = float(node.sampler.version)
            record[f"sampler/{node.name}/idle"] = 1.0 - node.busy_seconds / now
        return record

    def summary(self) -> dict:
        now = max(self.loop.now, 1e-12)
        return {
            "virtual_seconds": self.loop.now,
            **self.buffer.summary(),
            "learner_idle": 1.0 - self.learner_busy_seconds / now,
            "sampler_idle": {n.name: 1.0 - n.busy_seconds / now for n in self.nodes},
            "tokens_per_virtual_second": sum(n.tokens for n in self.nodes) / now,
            "weight_bytes_sent": self.sync_bytes,
            "weight_bytes_full": self.sync_full_bytes,
        }
