"""The learner's intake of rollout groups from the network: decode, validate, deduplicate, journal, queue.

Every group that arrives ends in exactly one outcome, counted by name: accepted, duplicate (not queued again: a
sampler retrying an upload whose answer it lost must not make the learner train twice on one group), filtered
(with `learner.dynamic_sampling` a group whose rewards are all equal: valid but uninformative, so the sampler
generates another), busy (the queue is full: the sampler sends it again later), finished, or a rejection with its
reason:

| reason | meaning |
| --- | --- |
| unauthorized | missing or wrong credential (counted by the transport, before any body is read) |
| unknown_sampler | a sampler name that is not one of `cluster.samplers` |
| too_large | upload over `live.max_body_bytes` |
| corrupt | the group's xxh3-128 differs from the digest the sampler sent with it |
| malformed | not a rollout message (framing, header JSON, array sizes), or an upload that does not parse |
| too_long | completion over `sampler.max_new_tokens`, or prompt + completion over the model's context |
| out_of_vocab | a token id outside the learner's vocabulary |
| bad_logprobs | a behaviour log-prob that is not finite or is > 0 |
| future_version | a token version newer than the newest published (or negative); a claimed version never published |
| group_size | not `sampler.group_size` completions |
| prompt_mismatch | prompt ids other than the learner's tokenization of the prompt (tokenizer, chat template) |
| bad_rewards | a non-finite reward |
| invalid | any other content check (empty prompt, over-long group id, a group from another sampler) |
| bad_http | not a request the transport can parse (request line, headers, Content-Length, chunking) |
| timeout | a request head or body not received in time (`live.header_timeout_s`, `live.body_timeout_s`) |
| too_many_connections | a connection beyond `live.max_connections` (refused at once) |
| disk_full | the journal could not store the group (disk full or failing): retry later, nothing was kept |
| id_conflict | a group id already used by a group with other content (a retried upload sends the same bytes) |
| internal_error | a bug in a handler of the learner (counted, logged in one line: no traceback per request) |
| config_mismatch | an upload from a sampler whose config differs from the learner's in a setting they must share |
| not_regular | a store entry where an upload belongs that is not a regular file (FIFO, socket, device, symlink) |

The transports map reasons to their own codes (HTTP statuses: `transport/http/status.py`).

The digest header is optional (a hand-made request may omit it); samplers always send it.
A group is acknowledged only after it is in the journal (durable) and in the buffer (in memory), both under
one lock shared with the training thread, so an acknowledged group is never lost and never trained twice.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import xxhash

from heterorl import failpoints
from heterorl.durable.journal import Journal
from heterorl.frictions import KINDS as FRICTION_KINDS
from heterorl.loop.staleness import RolloutBuffer
from heterorl.rollout import RolloutGroup
from heterorl.rollout_codec import GroupLimits, RolloutError, decode_group
from heterorl.sampler import VERDICT_INFO

REASONS = (
    "unauthorized",
    "unknown_sampler",
    "too_large",
    "corrupt",
    "malformed",
    "too_long",
    "out_of_vocab",
    "bad_logprobs",
    "future_version",
    "group_size",
    "prompt_mismatch",
    "bad_rewards",
    "invalid",
    "bad_http",
    "timeout",
    "too_many_connections",
    "disk_full",
    "id_conflict",
    "internal_error",
    "not_regular",
    "config_mismatch",
)
MAX_GROUP_ID_CHARS = 200
KNOWN_INFO = frozenset(FRICTION_KINDS) | frozenset(VERDICT_INFO)  # what samplers count in `RolloutGroup.info`
ACKED = ("accepted", "duplicate")  # outcomes after which the group is the learner's
RETRIED = ("busy", "finished")  # outcomes after which the group may still arrive (or the run is over)


def body_digest(body: bytes) -> str:
    """The `X-Heterorl-Digest` value of a body: its xxh3-128, hex. Catches corruption in transit; the rollout
    format itself carries no checksum, and a flipped byte can leave a group that still validates."""
    return xxhash.xxh3_128_hexdigest(body)


def rejection_reason(err: RolloutError) -> str:
    """The counted reason of a decode/validation error (set where it is raised)."""
    return err.reason


@dataclass(frozen=True)
class Verdict:
    """The outcome of one group: its name, and what to tell the sampler."""

    outcome: str  # accepted | duplicate | filtered | busy | finished | a rejection reason
    group_id: str | None = None
    detail: str = ""


@dataclass
class IntakeCounters:
    accepted: int = 0
    duplicates: int = 0
    filtered: int = 0
    busy: int = 0
    tokens: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    info: Counter[str] = field(default_factory=Counter)  # the accepted groups' `info` counts, summed

    def to_json(self) -> dict:
        return {
            **{k: getattr(self, k) for k in ("accepted", "duplicates", "filtered", "busy", "tokens")},
            "rejected": self.rejected,
            "info": self.info,
        }

    @classmethod
    def from_json(cls, data: dict) -> IntakeCounters:
        return cls(**{**data, "rejected": Counter(data["rejected"]), "info": Counter(data.get("info", {}))})


class Intake:
    """The learner's buffer, journal and group bookkeeping, shared by the HTTP handlers and the training thread."""

    def __init__(
        self,
        buffer: RolloutBuffer,
        journal: Journal | None,
        base_limits: GroupLimits,
        max_queued: int,
        prompt_ids: Callable[[str], list[int]] | None = None,
        filter_uniform: bool = False,
    ) -> None:
        self.buffer, self.journal, self.max_queued = buffer, journal, max_queued
        self.prompt_ids = prompt_ids  # the learner's own tokenization of a prompt text
        self.filter_uniform = filter_uniform  # DAPO's dynamic sampling
        self.base_limits = base_limits  # everything but the current version
        self.cond = threading.Condition()  # guards everything below; the training thread waits on it
        self.counters = IntakeCounters()
        self.consumed: dict[str, str] = {}  # id -> body digest of groups trained or dropped by the window
        self.payloads: dict[str, bytes] = {}  # queued group id -> its message (checkpointed as is)
        self.finished = False
        self.closed = False

    def limits(self, current_version: int) -> GroupLimits:
        return dataclasses.replace(self.base_limits, current_version=current_version)

    # ---------------------------------------------------------------- network side
    def reject(self, reason: str, detail: str = "") -> Verdict:
        """Count a rejection and build its verdict (the service calls this for 401 and 413 itself)."""
        with self.cond:
            self.counters.rejected[reason] += 1
        return Verdict(reason, detail=detail)

    def count_busy(self) -> None:
        """Count a POST turned away before it was read (the service's upload limit), like a full queue."""
        with self.cond:
            self.counters.busy += 1

    def accept(
        self, body: bytes, current_version: int, digest: str | None = None, sender: str | None = None
    ) -> Verdict:
        """Check `digest` (when sent), decode and validate one message (from `sender`, when known: a sampler posts
        only its own groups, under ids it owns); journal and queue it unless it is a duplicate (or the queue is
        full)."""
        if digest is not None and digest != body_digest(body):
            return self.reject("corrupt", "body does not match its digest")
        try:
            group = decode_group(body, self.limits(current_version))
        except RolloutError as err:
            return self.reject(rejection_reason(err), str(err))
        if not 0 < len(group.group_id) <= MAX_GROUP_ID_CHARS or len(group.sampler_id) > MAX_GROUP_ID_CHARS:
            return self.reject("invalid", f"group and sampler ids must have 1 to {MAX_GROUP_ID_CHARS} characters")
        if sender is not None and (group.sampler_id != sender or not group.group_id.startswith(f"{sender}:")):
            return self.reject("invalid", f"a group of {group.sampler_id[:64]!r} sent by {sender[:64]!r}")
        if not set(group.info) <= KNOWN_INFO:
            return self.reject("invalid", f"info keys {sorted(set(group.info) - KNOWN_INFO)[:4]} are not counts")
        if self.prompt_ids is not None and self.prompt_ids(group.prompt) != group.prompt_ids_P.tolist():
            return self.reject("prompt_mismatch", "prompt ids differ from the learner's tokenization of the prompt")
        gid = group.group_id
        with self.cond:
            if self.finished:
                return Verdict("finished", gid, "the run is finished")
            if gid in self.payloads or gid in self.consumed:
                if gid in self.payloads:
                    same = self.payloads[gid] == body
                else:  # "" : consumed under a state written before digests were kept
                    same = self.consumed[gid] in ("", digest or body_digest(body))
                if not same:
                    self.counters.rejected["id_conflict"] += 1
                    return Verdict("id_conflict", gid, "this group id was acknowledged with other content")
                self.counters.duplicates += 1
                return Verdict("duplicate", gid)
            if self.filter_uniform and bool((group.rewards_G == group.rewards_G[0]).all()):
                self.counters.filtered += 1
                return Verdict("filtered", gid, "all rewards equal (dynamic sampling)")
            if len(self.buffer) >= self.max_queued:
                self.counters.busy += 1
                return Verdict("busy", gid, f"{len(self.buffer)} groups queued")
            if self.journal is not None:
                try:
                    self.journal.append(body)  # durable before it is acknowledged
                except OSError as err:  # disk full or failing: not durable, so not acknowledged (no trace left)
                    self.counters.rejected["disk_full"] += 1
                    return Verdict("disk_full", gid, f"the learner cannot store it now: {err.strerror}")
                failpoints.hit("journal.appended")  # durable, not yet acknowledged
            self.buffer.add(group)
            self.payloads[gid] = body
            self.counters.accepted += 1
            self.counters.tokens += group.num_tokens
            self.counters.info.update(group.info)
            self.cond.notify_all()
        return Verdict("accepted", gid)

    # ---------------------------------------------------------------- learner side
    def take(self, n: int, learner_version: int, timeout: float) -> tuple[list[RolloutGroup], dict[str, float]] | None:
        """The next batch (RolloutBuffer.take), waiting up to `timeout` s for enough groups; None if too few."""
        with self.cond:
            self.cond.wait_for(lambda: len(self.buffer) >= n or self.closed, timeout)
            before = set(self.payloads)
            taken = self.buffer.take(n, learner_version)
            left = {g.group_id for g in self.buffer.groups}
            for gid in before - left:  # trained now, or dropped by the staleness window
                self.consumed[gid] = body_digest(self.payloads.pop(gid))
        return taken

    def close(self) -> None:
        """Wake the training thread (shutdown)."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def checkpoint_view(self) -> tuple[list[bytes], dict[str, str], int]:
        """(queued messages oldest first, consumed ids -> digests, first journal segment after them), atomically.

        Rotating the journal under the lock splits accepted groups exactly: those in the queue or consumed now
        belong to the checkpoint, later ones to the segments from the returned index on.
        """
        assert self.journal is not None, "a checkpoint of the queue needs the journal"
        with self.cond:
            queue = [self.payloads[g.group_id] for g in self.buffer.groups]
            return queue, dict(self.consumed), self.journal.rotate()

    def restore(self, consumed: dict[str, str], checkpointed: list[bytes], journaled: list[bytes]) -> int:
        """Rebuild the queue after a restart: the checkpoint's queue, then the journal; returns groups queued.

        Journaled groups were accepted after the checkpoint, so they are counted as accepted again (the
        counters come from the checkpoint). Versions are not re-checked: a group accepted before a crash may be
        newer than the version the learner resumes at; it was valid when acknowledged and is trained, not lost.
        """
        limits = self.limits(2**31 - 1)
        with self.cond:
            self.consumed = dict(consumed)
            for body, fresh in [(b, False) for b in checkpointed] + [(b, True) for b in journaled]:
                group = decode_group(body, limits)
                if group.group_id in self.consumed or group.group_id in self.payloads:
                    continue
                self.buffer.add(group)
                self.payloads[group.group_id] = body
                if fresh:
                    self.counters.accepted += 1
                    self.counters.tokens += group.num_tokens
                    self.counters.info.update(group.info)
            return len(self.buffer)

    # ---------------------------------------------------------------- reporting
    def counters_json(self) -> dict:
        """The counters as JSON (a consistent copy)."""
        with self.cond:
            data = self.counters.to_json()
            return {**data, "rejected": dict(data["rejected"]), "info": dict(data["info"])}

    def metrics(self) -> dict[str, float]:
        """`net/*` counters for a metrics record (every rejection reason present, 0 when none)."""
        with self.cond:
            c = self.counters
            out = {
                "net/accepted_total": float(c.accepted),
                "net/duplicates_total": float(c.duplicates),
                "net/filtered_total": float(c.filtered),
                "net/busy_total": float(c.busy),
                "net/queue": float(len(self.buffer)),
            }
            out.update({f"net/rejected_{r}": float(c.rejected[r]) for r in REASONS})
        return out
