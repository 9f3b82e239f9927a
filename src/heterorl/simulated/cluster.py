"""The simulated cluster: the learner loop and the sampler workers scheduled on a virtual clock.

Generation, training and weight encoding run for real (`heterorl.loop`); only time is modelled:
- a sampler generating n tokens is busy n / tokens_per_second virtual seconds;
- a learner step costs `learner_step_seconds + learner_seconds_per_token * tokens`;
- a message takes `delay + bytes / bandwidth` on its link's FIFO path (`heterorl.transport.simulated`), with
  the link's faults applied to its bytes.

Weights are pushed: a published version goes to every sampler at once, as the store's smallest update from what
the sampler was last sent (a patch chain over a FIFO path, snapshots as the store decides), each copy through the
learner's uplink (`cluster.learner_uplink_mbps`) first. On a fault-free link (`cluster.share_weights`) the sampler
takes the learner's published tensors themselves (`heterorl.simulated.shared_weights`: the same bits, no decode), and
the update's size -- which sets its arrival on a finite bandwidth and the traffic figures -- is settled when the
background publish is done: the arrival is a deferred event no earlier than send time + delay, so the encode
overlaps the next learner step instead of stalling the simulation; every pending send is settled, in sending
order, before the next publish and whenever bytes must go out. With `transport.weights: store` the learner uploads each
version once instead and samplers pull it at their next manifest poll (`heterorl.simulated.store`). An update the
sampler refuses (corrupt, wrong base) makes it ask again from what it holds (a snapshot); a lost one is asked for
again `link.retry_seconds` later. Rollout groups travel as their wire bytes and enter the learner through the
same intake as in a live cluster (validation, de-duplication, counters).

Same config + seed => identical metrics apart from wall-clock fields: every stream is seeded and events at equal
times run first-in first-out.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

from heterorl.config import RunConfig
from heterorl.loop.intake import ACKED, Verdict, body_digest
from heterorl.loop.learner_loop import LearnerLoop, StepResult
from heterorl.loop.sampler_loop import SamplerWorker
from heterorl.network import Link
from heterorl.policy import run_process
from heterorl.rollout import RolloutGroup
from heterorl.rollout_codec import encode_group
from heterorl.simulated.events import EventLoop
from heterorl.simulated.shared_weights import SharedUpdate
from heterorl.simulated.store import SimStore
from heterorl.transport.simulated import SimPath, SimUplink
from heterorl.transport.store.manifest import Manifest
from heterorl.weights import Update
from heterorl.weights.envelope import EnvelopeError, decode_update, encode_update, envelope_nbytes

REFUSALS_BEFORE_STALL = 256  # groups refused in a row (none accepted, no step trained) before the simulator gives up


def overgeneration_warning(cfg: RunConfig) -> str | None:
    """A warning when the simulated samplers would generate (really compute) far more per learner step than the
    learner can train on: nothing bounds them in async mode without `cluster.max_queued_steps`, and a run with
    fast virtual samplers and a slow virtual learner then looks hung."""
    cc = cfg.cluster
    if cc.mode != "async" or cc.max_queued_steps is not None:
        return None
    most = cfg.learner.groups_per_step * cfg.sampler.group_size * cfg.sampler.max_new_tokens  # tokens a step trains
    step_seconds = cc.learner_step_seconds + cc.learner_seconds_per_token * most
    generated = sum(n.tokens_per_second for n in cc.samplers) * step_seconds
    if generated <= 10 * most:
        return None
    return (
        f"the simulated samplers can generate ~{generated:,.0f} tokens per learner step (really computed) while a "
        f"step trains at most {most:,}; set cluster.max_queued_steps to bound them, or lower their speeds"
    )


@dataclass
class SimNode:
    """A sampler machine: its worker, speed and link, and what the simulation knows of it."""

    worker: SamplerWorker
    tokens_per_second: float
    weights: SimPath
    rollout: SimPath
    retry_seconds: float
    sent: tuple[int | None, str | None] = (None, None)  # what it will hold once in-flight updates land
    generating: bool = False
    started_at: float = 0.0
    busy_seconds: float = 0.0
    in_store: int = 0  # groups stored but not yet taken by the learner (rollouts through the store)

    @property
    def name(self) -> str:
        return self.worker.name


@dataclass
class PendingSend:
    """A shared (in-process) weight update on its way whose size is not settled yet: what the bytes path would have
    charged at `at` is computed once the version's publish is done (`SimulatedCluster._settle`)."""

    node: SimNode
    at: float  # sending time
    delay: float  # the path's delay sample, drawn at sending time as the bytes path draws it
    update: SharedUpdate
    arrival: float | None = None  # known at once on an unlimited link, else when settled


class SimulatedCluster:
    """Runs the learner loop to `learner.steps` with the samplers on a virtual clock."""

    def __init__(self, cfg: RunConfig, loop: LearnerLoop, workers: list[SamplerWorker], events: EventLoop) -> None:
        cc = cfg.cluster
        if len(workers) != len(cc.samplers):
            raise ValueError(f"{len(workers)} samplers for {len(cc.samplers)} configured nodes")
        self.cfg, self.cc, self.loop, self.events = cfg, cc, loop, events
        self.nodes = []
        for i, (worker, node_cfg) in enumerate(zip(workers, cc.samplers, strict=True)):
            link = Link(node_cfg.link, seed=cfg.seed, index=i)
            weights, rollout = SimPath(link, "weights"), SimPath(link, "rollout")
            self.nodes.append(
                SimNode(worker, node_cfg.tokens_per_second, weights, rollout, node_cfg.link.retry_seconds)
            )
        self.learner_busy = False
        self.refused_in_a_row = 0
        self.warning = overgeneration_warning(cfg)
        self.uplink = SimUplink(cc.learner_uplink_mbps)
        self.store = SimStore(cfg, loop, lambda: events.now, len(workers)) if cfg.transport.uses_store else None
        self.pending: list[PendingSend] = []  # shared updates sent, in sending order, whose sizes are not settled

    # ------------------------------------------------------------------ running
    def run(self) -> None:
        self.loop.start()
        self.events.schedule_in(0.0, self._send_newest, label=f"send v{self.loop.published_version}")
        self.events.run_until(lambda: self.loop.done)
        if not self.loop.done:
            raise RuntimeError("the simulation stalled: no event left before the last learner step")
        self._settle()  # updates sent before the end count in the traffic, as they were sent

    def close(self) -> None:
        """Release the samplers' engines (a vLLM engine holds processes and memory)."""
        for node in self.nodes:
            node.worker.sampler.engine.close()

    def summary(self) -> dict:
        """The nodes' own figures (their faults and weight updates) for summary.json."""
        return {
            "samplers": {
                n.name: {
                    "tokens": n.worker.tokens,
                    "updates_applied": n.worker.applied,
                    "updates_failed": n.worker.failed,
                    "updates_ignored": n.worker.ignored,
                    "faults_weights": dict(n.weights.faults),
                    "faults_rollout": dict(n.rollout.faults),
                }
                for n in self.nodes
            },
            **({} if self.store is None else {"store": self.store.summary()}),
        }

    # ------------------------------------------------------------------ weights path
    def _send_newest(self) -> None:
        """Push the newest version to every sampler: the smallest update from what it was sent before."""
        if self.store is not None and self.store.weights:
            self.loop.publisher.result()
            self._upload_to_store()
            return
        shared = None
        for node in self.nodes:
            if self._shares(node):
                if shared is None:
                    shared = SharedUpdate(self.loop.published_version, self.loop.published_weights, self._settle)
                self._send_shared(node, shared)
            else:
                self._send_update(node)

    def _shares(self, node: SimNode) -> bool:
        """Does `node` take the learner's tensors by reference? (Not through the store, nor over a faulty link.)"""
        return self.cc.share_weights and not node.weights.lossy and not (self.store is not None and self.store.weights)

    def _send_shared(self, node: SimNode, update: SharedUpdate) -> None:
        """Send `update` by reference: what it costs on the wire is settled later; so is its arrival, unless no
        link it crosses has a bandwidth limit (then the size cannot change it)."""
        assert all(p.node is not node for p in self.pending), f"{node.name} has an unsettled send"
        if node.sent[0] == update.version:  # the store's noop: it was sent this version already
            return
        now = self.events.now
        send = PendingSend(node, now, node.weights.draw_delay(), update)
        self.pending.append(send)
        label = f"weights v{update.version} -> {node.name}"
        if node.weights.unlimited and self.uplink.bandwidth_mbps is None:
            send.arrival = node.weights.arrive(now, 0, send.delay)  # its bytes are added to the path when settled
            self.events.schedule(send.arrival, self._weights_arrive, node, update, label=label)
        else:
            self.events.schedule_deferred(
                now + send.delay, lambda: self._arrival(send), self._weights_arrive, node, update, label=label
            )

    def _arrival(self, send: PendingSend) -> float:
        self._settle()
        assert send.arrival is not None
        return send.arrival

    def _settle(self) -> None:
        """Settle every pending shared send, in sending order, as the bytes path would have charged it when it was
        sent: the store's update from what the node was sent before (the store has not moved on: the next
        publish starts only after this), its framed size through the uplink and the node's path, the traffic."""
        if not self.pending:
            return
        self.loop.publisher.result()  # the version's publish: its patch, snapshot and hash are in the store
        pending, self.pending = self.pending, []
        for send in pending:
            node = send.node
            update = self.loop.store.update_for(*node.sent)
            assert update.version == send.update.version, f"store at v{update.version}, sent v{send.update.version}"
            send.update.state_hash = update.state_hash
            node.sent = (update.version, update.state_hash)
            nbytes = envelope_nbytes(update)
            self.loop.traffic.sent(update.version, nbytes, self.loop.full_update_nbytes())
            start = self.uplink.done_at(send.at, nbytes)
            if send.arrival is None:
                send.arrival = node.weights.arrive(start, nbytes, send.delay)
            else:
                node.weights.bytes_sent += nbytes

    def _send_update(self, node: SimNode) -> None:
        """Send `node` the store's update from what it was sent before, as bytes (or through the store)."""
        if self.store is not None and self.store.weights:
            self._store_poll(node)
            return
        self._settle()  # earlier shared sends go first through the uplink, and the store must be complete
        self.loop.publisher.result()
        update = self.loop.store.update_for(*node.sent)
        if update.kind == "noop":
            return
        node.sent = (update.version, update.state_hash)
        nbytes = envelope_nbytes(update)  # what it costs on the wire, framed as a live transport sends it
        self.loop.traffic.sent(update.version, nbytes, self.loop.full_update_nbytes())
        self._deliver(node, update, nbytes, self.uplink.done_at(self.events.now, nbytes))

    def _deliver(self, node: SimNode, update: Update, nbytes: int, start: float, envelope: bytes | None = None) -> None:
        """Send `update` (`nbytes` on the wire) over the node's weights path from `start`."""
        label = f"weights v{update.version} -> {node.name}"
        if not node.weights.lossy:  # nothing can alter it on the way: no need to frame it
            at = node.weights.arrival(start, nbytes)
            self.events.schedule(at, self._weights_arrive, node, update, label=label)
            return
        deliveries = node.weights.send(start, envelope or encode_update(update))
        for d in deliveries:
            self.events.schedule(d.at, self._weights_arrive, node, d.payload, label=label)
        if not deliveries:  # lost: the sampler asks again after its retry delay
            self.events.schedule_in(node.retry_seconds, self._resend, node, label=f"retry -> {node.name}")

    # ------------------------------------------------------------------ weights through the store
    def _upload_to_store(self) -> None:
        """The learner uploads the new version's objects once; they are visible when the upload is done."""
        assert self.store is not None
        nbytes, manifest = self.store.upload()
        if manifest is not None:
            at = self.uplink.done_at(self.events.now, nbytes)
            self.events.schedule(at, self._store_visible, manifest, label=f"store v{manifest.latest[0]} visible")

    def _store_visible(self, manifest: Manifest) -> None:
        assert self.store is not None
        self.store.visible = manifest
        for i, node in enumerate(self.nodes):
            at = self.store.next_poll(i, self.events.now)
            self.events.schedule(at, self._store_poll, node, label=f"{node.name} polls the manifest")

    def _store_poll(self, node: SimNode) -> None:
        """The sampler downloads the cheapest chain from what it will hold to the visible version."""
        assert self.store is not None
        got = self.store.fetch(node.worker.index, node.sent)
        if got is None:
            return
        envelope, nbytes = got
        update = decode_update(envelope)
        node.sent = (update.version, update.state_hash)
        self._deliver(node, update, nbytes, self.events.now, envelope)

    def _resend(self, node: SimNode) -> None:
        self._settle()
        node.sent = node.worker.held()
        self._send_update(node)

    def _weights_arrive(self, node: SimNode, message: Update | SharedUpdate | bytes) -> None:
        failed_before = node.worker.failed
        if isinstance(message, bytes):
            try:
                node.worker.receive(decode_update(message))
            except EnvelopeError as err:
                node.worker.refused(f"envelope: {err}")
        else:
            node.worker.receive(message)
        if node.worker.failed != failed_before:  # refused: ask again from what it really holds
            self._resend(node)
        self._maybe_generate(node)

    # ------------------------------------------------------------------ generation
    def _maybe_generate(self, node: SimNode) -> None:
        if node.generating or self.loop.done:
            return
        if self.store is not None and self.store.rollouts and node.in_store >= self.store.max_pending:
            return  # the sink's backpressure: wait until the learner has taken some
        n = node.worker.wants()
        if n == 0 or not self.loop.admit(n, node.worker.version):
            return
        node.generating, node.started_at = True, self.events.now
        process = node.worker.generate(n)
        if node.worker.interruptible:
            self._advance(node, process)
        else:
            self._schedule_finish(node, run_process(process))

    def _advance(self, node: SimNode, process: Generator[int, None, list[RolloutGroup]]) -> None:
        """Run one decoding step; resume when its tokens would be done in virtual time."""
        try:
            tokens_done = next(process)
        except StopIteration as end:
            self._schedule_finish(node, end.value)
            return
        at = max(node.started_at + tokens_done / node.tokens_per_second, self.events.now)
        self.events.schedule(at, self._advance, node, process, label=f"{node.name} decode")

    def _schedule_finish(self, node: SimNode, groups: list[RolloutGroup]) -> None:
        tokens = sum(g.num_tokens for g in groups)
        at = max(node.started_at + tokens / node.tokens_per_second, self.events.now)
        self.events.schedule(at, self._finish, node, groups, label=f"{node.name} done")

    def _finish(self, node: SimNode, groups: list[RolloutGroup]) -> None:
        node.generating = False
        node.busy_seconds += self.events.now - node.started_at
        for g in groups:
            g.created_at, g.finished_at = node.started_at, self.events.now
            payload = encode_group(g)
            digest = body_digest(payload) if node.rollout.lossy else None
            deliveries = node.rollout.send(self.events.now, payload)
            for d in deliveries:
                at = d.at
                if self.store is not None and self.store.rollouts:
                    at = self.store.next_listing(d.at)
                    node.in_store += 1
                self.events.schedule(at, self._group_arrives, node, g, d.payload, digest, label=f"group {g.group_id}")
            if not deliveries:
                node.worker.delivered(g, "dropped")
                self.loop.release(1)
        self._maybe_generate(node)

    # ------------------------------------------------------------------ learner
    def _group_arrives(self, node: SimNode, group: RolloutGroup, payload: bytes, digest: str | None) -> None:
        verdict = self.loop.offer(payload, digest)
        node.worker.delivered(group, verdict.outcome)
        self._count_refusals(verdict)
        if self.store is not None and self.store.rollouts:
            node.in_store -= 1
            self._maybe_generate(node)
        elif verdict.outcome not in ACKED:
            self._maybe_generate(node)  # sync mode generates the missing group again
        self._maybe_train()

    def _count_refusals(self, verdict: Verdict) -> None:
        """Stop loudly when the learner refuses every group and trains no step: in virtual time nothing else would
        end the run."""
        self.refused_in_a_row = 0 if verdict.outcome in ACKED else self.refused_in_a_row + 1
        if self.refused_in_a_row >= REFUSALS_BEFORE_STALL:
            raise RuntimeError(
                f"the learner refused the last {self.refused_in_a_row} groups it was offered "
                f"(last: {verdict.outcome} {verdict.status}: {verdict.detail}); the run cannot progress"
            )

    def _maybe_train(self) -> None:
        if self.learner_busy or self.loop.done:
            return
        buffer = self.loop.intake.buffer
        dropped_before = buffer.dropped
        taken = self.loop.take()
        if buffer.dropped != dropped_before:
            self._wake_samplers()  # dropped groups free admission budget
        if taken is None:
            return
        result = self.loop.train(taken)
        cost = self.cc.learner_step_seconds + self.cc.learner_seconds_per_token * result.tokens
        self.learner_busy = True
        self.events.schedule_in(cost, self._train_done, result, cost, label=f"learner step {self.loop.learner.version}")

    def _train_done(self, result: StepResult, cost: float) -> None:
        self.learner_busy = False
        self.refused_in_a_row = 0  # the learner progresses: refusals (a full queue, say) are not a stall
        self._settle()  # before the next publish moves the store on, and before the record counts the traffic
        now = max(self.events.now, 1e-12)
        for node in self.nodes:
            idle = 1.0 - node.busy_seconds / now
            self.loop.peers.heard(node.name, node.worker.version, idle, node.worker.failed)
        self.loop.commit(result, busy_seconds=cost)  # publish (overlaps the next step: ParaBlock), record, evaluate
        self.events.schedule_in(0.0, self._send_newest, label=f"send v{self.loop.published_version}")
        self._wake_samplers()
        self._maybe_train()

    def _wake_samplers(self) -> None:
        for node in self.nodes:
            self._maybe_generate(node)
