"""A sampler's side of the conversation with the learner, written once for every clock and transport: what to
generate, what to send, what each answer means. No I/O and no clock.

The driver reports what happened and carries out what `next_actions()` returns:

    reports                                     actions
    weights_received(version)                   Pull()            keep one request for newer weights outstanding
    pulled()                                    Generate(n)       start generating n groups with the newest weights
    generated(groups, chunk_slots)              Send(upload)      send an upload (several may be in flight)
    replied(seq, reply) / send_failed(seq)      Wait(seconds)     call timer() after this long (nothing else to do
    timer()                                                        until then, or until another report)
    observe(rtt_s, seconds_per_group)

Rules (the only place they are written):
- Async mode: chunks of ceil(B / n_samplers) groups, with whatever weights are newest. Generation never waits for
  an answer: it goes on while groups are in flight, bounded by the groups generated and not answered yet -- the
  uploads window's worth, or what it generates during one round trip if that is more (the bandwidth-delay
  product, as TCP sizes its window), so a long round trip never throttles a sampler.
- Admission (async, with `cluster.eta` or `cluster.max_queued_steps`): a chunk uses slots the learner granted; a
  partial grant starts a smaller chunk. The session asks ahead (its running total `wanted`) for enough slots to
  keep generating for one round trip, sized from the round trip and generation speed the driver observes; when
  the learner grants nothing it asks again after the reply's `retry_after`. It holds granted - used - voided
  slots (`voided`: unused slots the learner took back when its lease ran out), reports `used`, and gives back
  (`returned`) the used slot of every group it will not deliver: one that became too stale for the learner's
  window before it was sent, one whose upload could not be delivered at all.
- Sync mode: its even share of each version's batch once the version arrived, generating again every group the
  learner did not keep (refused, filtered, undeliverable), so the learner always gets a full batch.
- Sending: up to `window` uploads in flight, each with up to `max_groups` groups of the outbox, oldest first; an
  upload goes as soon as the window has room (groups that queue meanwhile travel together). The window is
  `cluster.uploads_in_flight`, or more when the round trip is long: enough full uploads for what it generates in
  one round trip, plus one (at most `MAX_WINDOW`); past the configured window only full uploads go, since each
  upload costs requests (a store's PUT, GETs and DELETEs), not only bytes. A group the learner
  could not take now (`busy`, `disk_full`) goes back to the front of the outbox and is sent again after
  `retry_after`. Running totals make retries idempotent.
- Stopping: the learner says the run is finished; or it refuses an upload for a reason no retry can change (its
  config does not match the learner's, a name the learner does not know); or it refuses `max_refusals` uploads or
  groups in a row (a revoked credential, a bug): `stopped` then says why.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass

from heterorl.config import RunConfig
from heterorl.config.fingerprint import fingerprint
from heterorl.loop.intake import ACKED, body_digest
from heterorl.loop.protocol import Reply, Upload
from heterorl.loop.staleness import staleness_window
from heterorl.rollout import RolloutGroup
from heterorl.rollout_codec import encode_group

RETRY_LATER = ("busy", "disk_full")  # the learner could not take the group now: it goes again, same bytes
FINISHED = "finished"
FILTERED = "filtered"
UNDELIVERABLE = "undeliverable"  # the transport gave up on an upload (the link stayed down past its patience)
NOT_REFUSALS = (FINISHED, FILTERED)  # answers that say nothing against the sampler
MAX_WINDOW = 64  # uploads in flight at most, however long the round trip
FATAL = ("config_mismatch", "unknown_sampler", "revoked", "quarantined")  # no retry can change them: the session stops


# ---------------------------------------------------------------------- actions
@dataclass(frozen=True)
class Generate:
    n: int


@dataclass(frozen=True)
class Send:
    upload: Upload


@dataclass(frozen=True)
class Pull:
    pass


@dataclass(frozen=True)
class Wait:
    seconds: float


Action = Generate | Send | Pull | Wait


@dataclass(eq=False)
class Outgoing:
    """A generated group waiting to be sent: its bytes (encoded once: a retry sends the same bytes) and its oldest
    version (read once: the staleness check looks at every waiting group before every send)."""

    group: RolloutGroup
    body: bytes
    digest: str
    min_version: int


class SamplerSession:
    """One sampler process's conversation state; see the module docstring."""

    def __init__(
        self,
        cfg: RunConfig,
        index: int,
        name: str,
        session_id: str,
        engine_slots: int = 1,
    ) -> None:
        cc, B = cfg.cluster, cfg.learner.groups_per_step
        n = len(cc.samplers)
        self.name, self.session_id = name, session_id
        self.fingerprint = fingerprint(cfg)
        self.sync = cc.mode == "sync"
        self.chunk = math.ceil(B / n)
        self.share = B // n + (1 if index < B % n else 0)  # sync mode: its even share of a batch
        self.admission = not self.sync and (cc.eta is not None or cc.max_queued_steps is not None)
        self.base_window = self.window = cc.uploads_in_flight
        self.max_groups = cc.groups_per_upload
        self.engine_slots = engine_slots if not self.sync else 1
        self.base_unanswered = self.window * self.max_groups + self.chunk * self.engine_slots
        self.max_unanswered = self.base_unanswered
        self.max_staleness = staleness_window(cc.max_staleness, cc.eta if not self.sync else None)
        self.max_refusals = cc.max_refusals_in_a_row
        # weights
        self.newest = -1  # the newest version received
        self.pulling = False
        # generation
        self.generating = 0  # chunks running
        self.outbox: deque[Outgoing] = deque()
        self.unanswered = 0  # groups generated (or being generated) and not answered yet
        # admission (running totals, as the learner counts them)
        self.granted = self.voided = self.used = self.returned = 0
        self.wanted = 0
        self.ask_ahead = 2 * self.chunk  # slots to hold beyond the current chunk, until round trips are observed
        self.grant_retry = False  # the learner granted nothing: ask again after a wait
        self.learner_id: str | None = None  # the learner process's boot id
        # sending
        self.seq = 0
        self.in_flight: dict[int, Upload] = {}
        self._items: dict[int, list[Outgoing]] = {}  # the groups of each upload in flight
        self.version_sent = -1
        self.learner_version = -1
        self.timer_pending = False
        self.timer_seconds = 0.0
        self.busy_retry = False
        # sync mode
        self.share_version = -1
        self.share_left = 0
        self.share_running = 0  # its groups generated or on their way for share_version
        # reports and end
        self.idle: float | None = None
        self.weights_failed = 0
        self.counts: Counter[str] = Counter()
        self.refusal: tuple[str, str] | None = None  # (reason, detail) of the current run of refusals
        self.refusals_in_a_row = 0
        self.refusal_reasons: Counter[str] = Counter()
        self.finished = False
        self.stopped: str | None = None  # why the session gave up (refused again and again)

    # ------------------------------------------------------------------ reports
    @property
    def done(self) -> bool:
        return self.finished or self.stopped is not None

    def finish(self) -> None:
        """The learner says the run is over."""
        self.finished = True

    def weights_received(self, version: int) -> None:
        """A newer version landed in the receiver (the engine loads it at its next generation or step)."""
        self.newest = max(self.newest, version)

    def pulled(self) -> None:
        """The outstanding weight request ended (whatever it brought)."""
        self.pulling = False

    def observe(self, rtt_s: float, seconds_per_group: float) -> None:
        """The driver's measurements: an upload's round trip, and generation time per group. The session asks
        ahead for enough slots to keep generating while a request for more crosses the link and back."""
        if seconds_per_group > 0.0 and math.isfinite(rtt_s):
            in_one_trip = math.ceil(rtt_s / seconds_per_group)  # groups it generates while an answer comes back
            self.ask_ahead = in_one_trip + self.chunk
            self.max_unanswered = max(self.base_unanswered, in_one_trip + self.chunk * self.engine_slots)
            full_uploads = math.ceil(in_one_trip / self.max_groups) + 1
            self.window = min(max(self.base_window, full_uploads), MAX_WINDOW)

    def generated(self, groups: list[RolloutGroup], slots: int) -> None:
        """A chunk of `slots` groups finished with these groups (an engine may return fewer: none are lost)."""
        self.generating -= 1
        self.unanswered -= slots - len(groups)
        if self.admission:
            self._give_back(slots - len(groups))
        if self.sync:
            self.share_running -= slots - len(groups)
        for g in groups:
            body = encode_group(g)
            self.outbox.append(Outgoing(g, body, body_digest(body), g.min_version))

    def replied(self, seq: int, reply: Reply) -> None:
        """The learner's answer to upload `seq` (duplicate answers to a retried upload are ignored)."""
        upload = self.in_flight.pop(seq, None)
        if upload is None:
            return
        if reply.learner and reply.learner != self.learner_id:
            if self.learner_id is not None:  # a restarted learner: it forgot the slots it granted
                self.granted = self.voided = self.used = self.returned = self.wanted = 0
            self.learner_id = reply.learner
        self.granted, self.voided = max(self.granted, reply.granted), max(self.voided, reply.voided)
        self.learner_version = max(self.learner_version, reply.version)
        if reply.finished:
            self.finished = True
        if upload.wanted > 0 and reply.granted < upload.wanted and reply.retry_after > 0.0:
            self.grant_retry = True
            self._want_timer(reply.retry_after)
        if reply.refused:  # nothing in it reached the learner's intake: its slots are still this session's
            self._refused(reply.refused, reply.detail)
            groups = self._groups_of(upload)
            if self.admission:
                self._give_back(len(groups))
            for group in groups:
                self._answered(group, reply.refused)
            return
        busy: list[Outgoing] = []
        for item, verdict in zip(self._outgoing_of(upload), reply.verdicts, strict=True):
            if verdict.outcome in RETRY_LATER:
                busy.append(item)
                continue
            if verdict.outcome in ACKED:
                self.refusals_in_a_row, self.refusal = 0, None
                self.refusal_reasons.clear()
            elif verdict.outcome not in NOT_REFUSALS:
                self._refused(verdict.outcome, verdict.detail)
            self._answered(item.group, verdict.outcome)
        if busy:
            self.outbox.extendleft(reversed(busy))
            self.busy_retry = True
            self._want_timer(max(reply.retry_after, 0.05))

    def send_failed(self, seq: int) -> None:
        """The transport gave up on upload `seq` for good: its groups will not arrive."""
        upload = self.in_flight.pop(seq, None)
        if upload is None:
            return
        groups = self._groups_of(upload)
        if self.admission:
            self._give_back(len(groups))
        for group in groups:
            self._answered(group, UNDELIVERABLE)

    def timer(self) -> None:
        self.timer_pending = False
        self.grant_retry = self.busy_retry = False

    # ------------------------------------------------------------------ decisions
    def next_actions(self) -> list[Action]:
        """What to do now (possibly nothing: wait for the next report)."""
        if self.done:
            return []
        actions: list[Action] = []
        if not self.pulling:
            self.pulling = True
            actions.append(Pull())
        actions += self._generations()
        actions += self._sends()
        if self.timer_seconds > 0.0 and not self.timer_pending:
            self.timer_pending = True
            actions.append(Wait(self.timer_seconds))
            self.timer_seconds = 0.0
        return actions

    def _generations(self) -> list[Action]:
        out: list[Action] = []
        while self.generating < self.engine_slots and self.newest >= 0:
            n = self._chunk_size()
            if n <= 0:
                break
            self.generating += 1
            self.unanswered += n
            if self.admission:
                self.used += n
            if self.sync:
                self.share_running += n
            out.append(Generate(n))
        return out

    def _chunk_size(self) -> int:
        if self.sync:
            if self.newest != self.share_version:
                self.share_version, self.share_left, self.share_running = self.newest, self.share, 0
            return max(0, self.share_left - self.share_running)
        room = self.max_unanswered - self.unanswered
        n = min(self.chunk, room)
        if self.admission:
            n = min(n, self.available)
        return max(n, 0)

    @property
    def available(self) -> int:
        """Granted slots neither used nor voided (a returned slot was used: giving it back frees the learner's
        budget, not one of this session's slots)."""
        return self.granted - self.voided - self.used

    def _sends(self) -> list[Action]:
        self._drop_stale()
        out: list[Action] = []
        if self.busy_retry:
            return out
        while len(self.in_flight) < self.window and self.outbox:
            if len(self.in_flight) >= self.base_window and len(self.outbox) < self.max_groups:
                break  # past the configured window only full uploads go: each costs requests, not just bytes
            items = [self.outbox.popleft() for _ in range(min(self.max_groups, len(self.outbox)))]
            out.append(Send(self._upload(items)))
        asking = self.admission and self.newest >= 0 and not self.grant_retry  # slots are granted for a version
        if asking and self._needs_slots() and len(self.in_flight) < self.window:
            out.append(Send(self._upload([])))  # ask for slots (nothing to send with the request)
        return out

    def _needs_slots(self) -> bool:
        """True when the slots held and asked for fall short of what keeps generation going, and no upload in
        flight already asks for them."""
        target = self.used + self.voided + self.ask_ahead
        return target > self.granted and target > max((u.wanted for u in self.in_flight.values()), default=0)

    def _upload(self, items: list[Outgoing]) -> Upload:
        if self.admission:
            self.wanted = max(self.wanted, self.used + self.voided + self.ask_ahead)
        upload = Upload(
            sampler=self.name,
            session=self.session_id,
            seq=self.seq,
            version=self.newest if self.newest >= 0 else -1,
            wanted=self.wanted,
            used=self.used,
            returned=self.returned,
            idle=self.idle,
            weights_failed=self.weights_failed,
            groups=tuple(i.body for i in items),
            digests=tuple(i.digest for i in items),
            fingerprint=self.fingerprint,
        )
        self._items[self.seq] = items
        self.in_flight[self.seq] = upload
        self.seq += 1
        return upload

    def _drop_stale(self) -> None:
        """Groups that the learner's window would drop on arrival are not sent: their slots go back."""
        if self.max_staleness is None or self.learner_version < 0:
            return
        oldest = self.learner_version - self.max_staleness  # the oldest version the learner still trains on
        if all(o.min_version >= oldest for o in self.outbox):
            return
        dropped = [o for o in self.outbox if o.min_version < oldest]
        self.outbox = deque(o for o in self.outbox if o.min_version >= oldest)
        if self.admission:
            self._give_back(len(dropped))
        for item in dropped:
            self._answered(item.group, "stale")

    # ------------------------------------------------------------------ bookkeeping
    def _outgoing_of(self, upload: Upload) -> list[Outgoing]:
        return self._items.pop(upload.seq)

    def _groups_of(self, upload: Upload) -> list[RolloutGroup]:
        return [o.group for o in self._items.pop(upload.seq)]

    def _give_back(self, n: int) -> None:
        self.returned += max(n, 0)

    def _answered(self, group: RolloutGroup, outcome: str) -> None:
        """A group's story is over (kept, refused, filtered, stale, undeliverable)."""
        self.counts[outcome] += 1
        self.unanswered -= 1
        if self.sync and group.min_version == self.share_version:
            self.share_running -= 1
            if outcome in ACKED:
                self.share_left -= 1

    def _refused(self, reason: str, detail: str) -> None:
        """Count a refusal; after `max_refusals` in a row (nothing kept in between) the session stops, naming the
        reason most of them gave: whatever it generates next would be refused too."""
        self.refusals_in_a_row += 1
        self.refusal_reasons[reason] += 1
        self.refusal = (reason, detail)
        if reason in FATAL:
            self.stopped = f"the learner refused it as {reason!r}" + (f": {detail}" if detail else "")
            return
        if self.refusals_in_a_row >= self.max_refusals:
            common, n = self.refusal_reasons.most_common(1)[0]
            last = f" (last: {detail})" if detail and reason == common else ""
            self.stopped = (
                f"the learner refused {self.refusals_in_a_row} uploads or groups in a row, {n} of them as "
                f"{common!r}{last}"
            )

    def _want_timer(self, seconds: float) -> None:
        if not self.timer_pending:
            self.timer_seconds = max(self.timer_seconds, seconds)
