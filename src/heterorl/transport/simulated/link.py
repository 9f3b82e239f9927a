"""The conversation over simulated links, in virtual time: what the HTTP transport does live, message by message.

Sampler side (`SimSamplerSide`, one per sampler; `transport.base.SamplerSide`):
- An upload crosses the link's up path as its bytes (`transport.wire`); the learner answers it at once
  (`LearnerLoop.exchange`) and the reply crosses the down path. A message lost or corrupted on the way is noticed as
  a live client notices it: no answer within `live.dead_after_s`, then the same bytes again after a seeded backoff;
  after `live.patience_s` without an answer the upload is given up (`done(None)`).
- A weight pull crosses the up path as a small request. At the learner, a sampler that holds the newest version
  waits (a long-poll) until a version is published or `wait_s` passed; otherwise the answer is the store's
  smallest update from what it holds: the newest version, patches merged, the versions in between skipped.

Learner side (`SimLearnerSide`, one per cluster; `transport.base.LearnerSide`): answers uploads and pulls, wakes
waiting pulls when a version is published. Weight updates leave through the learner's uplink
(`cluster.learner_uplink_mbps`, shared by everything it sends) and travel on their own down path (a connection of
their own, as the HTTP long-poll has), so a large update does not hold back the replies to uploads.

On a fault-free link with `cluster.share_weights` an update is the learner's published tensors by reference
(`simulated.shared_weights`): what it costs on the wire -- which sets its arrival on a finite bandwidth -- is
settled once the version's background publish is done, and its arrival is a deferred event no earlier than send
time + delay (`EventLoop.schedule_deferred`), so the encode overlaps the simulation. Every pending send is
settled, in sending order, before bytes go out on the uplink and before the next publish.

With `cluster.modelled` an update's size is a larger model's (`transport.simulated.modelled`): the small model's
update is what the sampler applies, the modelled size is what the uplink, the path and the traffic figures charge.
When the plan gives the large model's codec speeds, a published version is served only once its encode is done
(`ready_at`; pulls meanwhile wait as long-polls do) and an update is applied its decode time after it arrived;
uploads are charged at the large model's group size when the plan gives one.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from heterorl.config import RunConfig
from heterorl.loop.learner_loop import LearnerLoop
from heterorl.loop.protocol import Reply, Upload
from heterorl.network import Link
from heterorl.transport.backoff import Backoff, Liveness
from heterorl.transport.base import FINISHED, Held
from heterorl.transport.simulated.modelled import ModelledSizes
from heterorl.transport.simulated.paths import SimPath, SimUplink
from heterorl.transport.wire import WireError, decode_reply, decode_upload, encode_reply, encode_upload
from heterorl.weights import Update
from heterorl.weights.envelope import encode_update, envelope_nbytes

HEAD_BYTES = 256  # an HTTP request or response head as aiohttp sends it (a pull request, a 204, a reply's head)


class Scheduler(Protocol):
    """The simulator's event loop (`simulated.events.EventLoop`), as the link uses it."""

    @property
    def now(self) -> float: ...

    def schedule(self, at: float, callback: Callable[..., Any], *args: Any, label: str = "") -> Any: ...

    def schedule_in(self, delay: float, callback: Callable[..., Any], *args: Any, label: str = "") -> Any: ...

    def schedule_deferred(
        self, at_least: float, resolve: Callable[[], float], callback: Callable[..., Any], *args: Any, label: str = ""
    ) -> Any: ...


class InProcess(Protocol):
    """An update handed over by reference (`simulated.shared_weights.SharedUpdate`)."""

    version: int
    state_hash: str | None


@dataclass
class PendingSend:
    """A by-reference update on its way whose size is not settled yet (`SimLearnerSide.settle`)."""

    side: SimSamplerSide
    at: float  # sending time
    delay: float | None  # the path's delay sample, drawn at sending time (None: a path that settles at once)
    before: InProcess | None  # what the sampler was sent before: the update's size is the store's from there
    update: InProcess
    arrival: float | None = None


@dataclass
class ParkedPull:
    side: SimSamplerSide
    held: Callable[[], Held]
    done: Callable[[Any], None]
    handle: Any = None


@dataclass
class SimSamplerSide:
    """One sampler's end of its simulated link (see the module docstring)."""

    name: str
    link: Link
    learner: SimLearnerSide
    events: Scheduler
    liveness: Liveness
    patience_s: float
    backoff: Backoff
    up: SimPath = field(init=False)
    replies: SimPath = field(init=False)
    weights: SimPath = field(init=False)
    counts: Counter[str] = field(default_factory=Counter)
    sent: tuple[int, Any] | None = None  # (version, update) it was last sent by reference

    def __post_init__(self) -> None:
        self.up = SimPath(self.link, "rollout")  # the sampler's requests: it opens the connections
        self.replies = SimPath(self.link, "weights", opens=False)  # answers on the uploads' connection
        self.weights = SimPath(self.link, "weights", opens=False)  # answers on the weight pulls' own connection

    @property
    def shares(self) -> bool:
        """Does it take the learner's tensors by reference? (A fault-free weights path, share_weights on.)"""
        return self.learner.share_weights and not self.weights.lossy

    # ------------------------------------------------------------------ uploads
    @property
    def decode_s(self) -> float:
        """Virtual seconds between an update's arrival and its use (the modelled decode; 0 without a plan)."""
        modelled = self.learner.modelled
        return 0.0 if modelled is None else modelled.decode_seconds

    def exchange(self, upload: Upload, done: Callable[[Reply | None], None]) -> None:
        body = encode_upload(upload)
        modelled = self.learner.modelled
        nbytes = None if modelled is None else modelled.upload_nbytes(body, upload.groups)
        first = self.events.now
        state = {"answered": False, "attempt": 0, "sent": first}

        def answer(reply_bytes: bytes, attempt_no: int) -> None:
            if state["answered"]:
                return  # a duplicate, or the answer to an attempt already retried
            try:
                reply = decode_reply(reply_bytes, len(upload.groups))
            except WireError:
                self.counts["corrupt_replies"] += 1
                return  # as a live client would: no usable answer, the timeout retries
            state["answered"] = True
            self.backoff.reset()
            if self.liveness.answered(self.events.now - state["sent"], self.events.now):
                self.counts["link_up"] += 1
            done(reply)

        def attempt() -> None:
            if state["answered"]:
                return
            state["attempt"] += 1
            state["sent"] = self.events.now
            number = state["attempt"]
            for d in self.up.send(self.events.now, body, nbytes):
                label = f"upload {upload.seq} {self.name}"
                self.events.schedule(d.at, self._arrive_upload, d.payload, lambda b: answer(b, number), label=label)
            self.events.schedule_in(self.liveness.timeout(), timeout, number, label=f"{self.name} upload timeout")

        def timeout(number: int) -> None:
            if state["answered"] or number != state["attempt"]:
                return
            self.counts["timeouts"] += 1
            if self.liveness.timed_out():
                self.counts["link_down"] += 1
            if self.events.now - first > self.patience_s:
                state["answered"] = True
                done(None)
                return
            self.events.schedule_in(self.backoff.next_delay(), attempt, label=f"{self.name} upload retry")

        attempt()

    def _arrive_upload(self, body: bytes, answer: Callable[[bytes], None]) -> None:
        self.learner.take_upload(body, lambda reply: self._send_reply(reply, answer))

    def _send_reply(self, reply: bytes, answer: Callable[[bytes], None]) -> None:
        for d in self.replies.send(self.events.now, reply):
            self.events.schedule(d.at, answer, d.payload, label=f"reply -> {self.name}")

    # ------------------------------------------------------------------ weights
    def pull(self, held: Callable[[], Held], wait_s: float, done: Callable[[Any], None]) -> None:
        def attempt() -> None:
            arrivals = self.up.send(self.events.now, bytes(HEAD_BYTES))
            if not arrivals:  # the request was lost: the client times out and asks again
                self.counts["timeouts"] += 1
                wait = wait_s + self.liveness.timeout() + self.backoff.next_delay()
                self.events.schedule_in(wait, attempt, label=f"{self.name} pull retry")
                return
            self.events.schedule(
                arrivals[0].at,
                self.learner.answer_pull,
                ParkedPull(self, held, done),
                wait_s,
                label=f"pull {self.name}",
            )

        attempt()

    def deliver(self, message: Any, nbytes: int, start: float, done: Callable[[Any], None]) -> None:
        """Send a pull's answer (bytes or a small marker) over the weights path from `start`; an update is handed
        over its decode time after it arrived."""
        decode = 0.0 if message is None or message == FINISHED else self.decode_s
        if isinstance(message, bytes) and self.weights.lossy:
            deliveries = self.weights.send(start, message, nbytes)
            if not deliveries:  # lost: the client times out and asks again (the node pulls again on None)
                self.counts["lost_updates"] += 1
                at = start + self.liveness.timeout()
                self.events.schedule(at, done, None, label=f"weights lost -> {self.name}")
                return
            at = deliveries[0].at + decode
            self.events.schedule(at, done, deliveries[0].payload, label=f"weights -> {self.name}")
            return
        at = self.weights.arrival(start, nbytes) + decode
        self.events.schedule(at, done, message, label=f"weights -> {self.name}")

    def faults(self) -> dict[str, dict[str, int]]:
        """Faults injected on each path (counted by `SimPath.send`)."""
        return {
            name: dict(p.faults) for name, p in (("up", self.up), ("replies", self.replies), ("weights", self.weights))
        }

    def close(self) -> None:
        pass


class SimLearnerSide:
    """The learner's end of every simulated link (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        loop: LearnerLoop,
        events: Scheduler,
        share: Callable[[int, Callable[[], None]], InProcess],
        on_upload: Callable[[], None] = lambda: None,
    ) -> None:
        self.cfg, self.loop, self.events = cfg, loop, events
        self.share_weights = cfg.cluster.share_weights
        self.share = share  # (version, settle) -> an update by reference
        self.on_upload = on_upload  # the driver's hook after every upload the learner took in
        self.uplink = SimUplink(cfg.cluster.learner_uplink_mbps)
        self.modelled = ModelledSizes.from_config(cfg)  # None: updates cost their real bytes
        self.encode_s = 0.0 if self.modelled is None else self.modelled.encode_seconds
        self.ready_at = 0.0  # when the newest published version's (modelled) encode is done: served from then on
        self.parked: list[ParkedPull] = []
        self.pending: list[PendingSend] = []
        self.finished = False

    def side(self, index: int, name: str) -> SimSamplerSide:
        cfg, node = self.cfg, self.cfg.cluster.samplers[index]
        link = Link(node.link, seed=cfg.seed, index=index)
        backoff = Backoff(cfg.live.backoff_initial_s, cfg.live.backoff_max_s, random.Random(cfg.seed * 1000 + index))
        liveness = Liveness(cfg.live.dead_after_s)
        return SimSamplerSide(name, link, self, self.events, liveness, cfg.live.patience_s, backoff)

    # ------------------------------------------------------------------ uploads
    def take_upload(self, body: bytes, answer: Callable[[bytes], None]) -> None:
        """Answer an upload that arrived now: at once, or -- with `cluster.learner_seconds_per_group` -- after that
        long per group in it. Uploads are not queued behind one another: the figure is what live replies say the
        learner spent on an upload (`handled`, wall seconds), waits for the intake's lock and the CPU included, so
        a queue here would count those waits twice (measured on the WAN lab: 0.72x live's throughput with one,
        learner idle 40% against 16%)."""
        try:
            upload = decode_upload(body, self.cfg.cluster.groups_per_upload)
        except WireError as err:
            self.loop.intake.reject("malformed", str(err))
            answer(encode_reply(Reply(seq=0, refused="malformed", detail=str(err)[:200])))
            return
        cost = self.cfg.cluster.learner_seconds_per_group * len(upload.groups)
        if cost <= 0.0:
            answer(self._exchange(upload))
            return
        self.events.schedule_in(cost, lambda: answer(self._exchange(upload)), label=f"intake {upload.sampler}")

    def _exchange(self, upload: Upload) -> bytes:
        reply = self.loop.exchange(upload)
        self.on_upload()
        return encode_reply(reply)

    # ------------------------------------------------------------------ weights
    def answer_pull(self, pull: ParkedPull, wait_s: float) -> None:
        loop = self.loop
        if self.finished:
            pull.side.deliver(FINISHED, HEAD_BYTES, self.events.now, pull.done)
            return
        side = pull.side
        if self.events.now < self.ready_at:  # the newest version is still being encoded: answered once it is (or
            self._park(pull, wait_s)  # when the long-poll ends; a sampler holding nothing waits for it)
            return
        current = side.sent is not None and side.shares and side.sent[0] == loop.published_version
        if not side.shares:
            held = pull.held()
            current = held[0] == loop.published_version and held[1] == self._latest_hash()
        if current and wait_s > 0.0:
            self._park(pull, wait_s)
            return
        self._answer(pull)

    def _park(self, pull: ParkedPull, wait_s: float) -> None:
        if wait_s > 0.0:
            label = f"long-poll {pull.side.name} ends"
            pull.handle = self.events.schedule_in(wait_s, self._expire, pull, label=label)
        self.parked.append(pull)

    def _expire(self, pull: ParkedPull) -> None:
        if pull in self.parked:
            self.parked.remove(pull)
            pull.side.deliver(None, HEAD_BYTES, self.events.now, pull.done)

    def published(self, version: int) -> None:
        """A version was published: answer every waiting pull, once its modelled encode is done."""
        if self.encode_s > 0.0:
            self.ready_at = self.events.now + self.encode_s
            self.events.schedule(self.ready_at, self._serve_parked, label=f"v{version} encoded")
            return
        self._serve_parked()

    def _serve_parked(self) -> None:
        parked, self.parked = self.parked, []
        for pull in parked:
            if pull.handle is not None:
                pull.handle.cancel()
            self._answer(pull)

    def finish(self) -> None:
        self.finished = True
        parked, self.parked = self.parked, []
        for pull in parked:
            if pull.handle is not None:
                pull.handle.cancel()
            pull.side.deliver(FINISHED, HEAD_BYTES, self.events.now, pull.done)

    def _latest_hash(self) -> str | None:
        self.settle()
        self.loop.publisher.result()
        return self.loop.store.latest_hash

    def _answer(self, pull: ParkedPull) -> None:
        side, loop = pull.side, self.loop
        if side.shares:
            if side.sent is not None and side.sent[0] == loop.published_version:
                side.deliver(None, HEAD_BYTES, self.events.now, pull.done)
                return
            self._send_shared(pull)
            return
        self.settle()  # earlier by-reference sends go first through the uplink, and the store must be complete
        loop.publisher.result()
        held = pull.held()
        update = loop.store.update_for(*held)
        if update.kind == "noop":
            side.deliver(None, HEAD_BYTES, self.events.now, pull.done)
            return
        nbytes = self._charge(update, held)
        start = self.uplink.done_at(self.events.now, nbytes)
        side.deliver(encode_update(update) if side.weights.lossy else update, nbytes, start, pull.done)

    def _send_shared(self, pull: ParkedPull) -> None:
        """Send the newest version by reference: what it costs on the wire is settled later; so is its arrival,
        unless no link it crosses has a bandwidth limit (then the size cannot change it), or the path's model
        needs the size at once (`SimPath.deferrable`: then it is settled now)."""
        side, now, loop = pull.side, self.events.now, self.loop
        before = None if side.sent is None else side.sent[1]
        update = self.share(loop.published_version, self.settle)
        path = side.weights
        send = PendingSend(side, now, path.draw_delay() if path.deferrable else None, before, update)
        self.pending.append(send)
        side.sent = (update.version, update)
        label = f"weights v{update.version} -> {side.name}"
        if not path.deferrable:
            self.events.schedule(self._arrival(send), pull.done, update, label=label)
        elif path.unlimited and self.uplink.bandwidth_mbps is None:
            send.arrival = path.arrive(now, 0, send.delay)  # its bytes are added to the path when settled
            self.events.schedule(send.arrival + side.decode_s, pull.done, update, label=label)
        else:
            at_least = now + send.delay + side.decode_s
            self.events.schedule_deferred(at_least, lambda: self._arrival(send), pull.done, update, label=label)

    def _arrival(self, send: PendingSend) -> float:
        """When a by-reference update is handed to its sampler: its settled arrival plus the modelled decode."""
        self.settle()
        assert send.arrival is not None
        return send.arrival + send.side.decode_s

    def settle(self) -> None:
        """Settle every pending by-reference send, in sending order, as the bytes path would have charged it when
        it was sent: the store's update from what the sampler held, its framed size through the uplink and the
        sampler's path, the traffic (the store has not moved on: the next publish waits for this)."""
        if not self.pending:
            return
        loop = self.loop
        loop.publisher.result()  # the version's publish: its patch, snapshot and hash are in the store
        pending, self.pending = self.pending, []
        for send in pending:
            before = send.before  # settled earlier in this pass or before: its hash is known
            held = (None, None) if before is None else (before.version, before.state_hash)
            assert before is None or before.state_hash is not None, "sends are settled in sending order"
            update: Update = loop.store.update_for(*held)
            assert update.version == send.update.version, f"store at v{update.version}, sent v{send.update.version}"
            send.update.state_hash = update.state_hash
            nbytes = self._charge(update, held)
            start = self.uplink.done_at(send.at, nbytes)
            path = send.side.weights
            if send.delay is None:
                send.arrival = path.arrival(start, nbytes)
            elif send.arrival is None:
                send.arrival = path.arrive(start, nbytes, send.delay)
            else:
                path.add_bytes(nbytes)

    def _charge(self, update: Update, held: tuple[int | None, str | None]) -> int:
        """What `update` (the store's answer to a sampler holding `held`) costs on the wire, framed as a live
        transport sends it, or at the modelled model's size; counted in the traffic figures."""
        loop = self.loop
        if self.modelled is None:
            nbytes, full = envelope_nbytes(update), loop.full_update_nbytes()
        else:
            nbytes, full = self.modelled.update_nbytes(update, loop.store, held), self.modelled.full_nbytes
        loop.traffic.sent(update.version, nbytes, full)
        return nbytes
