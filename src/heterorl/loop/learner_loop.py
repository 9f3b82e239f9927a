"""The learner's side of the loop, written once and driven by either clock.

A learner step, as named calls a driver makes in this order:

    taken  = loop.take()          eligible groups: the staleness window drops the old ones, B oldest remain
    result = loop.train(taken)    advantages -> objective -> optimizer step(s) -> version + 1   (Learner)
    record = loop.commit(result)  publish the new version -> record the step -> evaluate / checkpoint

The simulated driver lets virtual time pass between `train` and `commit` (the step's modelled cost); the live
driver calls them back to back on the wall clock. Sampler sessions talk to it through `exchange`
(`loop.protocol`): each upload's groups go through the intake (decode, validate, de-duplicate, journal, queue),
its admission request through `Admission` (AReaL's capacity, partial grants, leases), whatever the transport.
Publishing runs in a worker thread (`BackgroundPublisher`), so it overlaps the next step; a record describes the
newest *complete* publication (the previous version's), which keeps records identical under every clock.

A group whose own gradient is not finite is dropped from its step and charged to its sampler; the rest of the
batch trains (`Learner.train_step`). A step that no group explains applies no update; its groups are consumed,
so they never come back. It still counts as a step and publishes a version (the same weights), so synchronous
samplers move on. `learner/skipped_steps` counts such steps; `learner.max_skipped_steps` in a row stop the run with
`TrainingDivergedError`, since something upstream (a reward function, the learner itself) then keeps failing.

The trust checks (`loop/screen.py`: quarantine, rewards recomputed, replays, a share of groups re-scored) run in
the intake on every group of every upload, whatever the transport, before it is acknowledged; every group's
outcome is charged to the sampler that uploaded it and every dropped group to its sampler (`loop/reputation.py`).
A quarantined sampler's uploads are refused whole (`quarantined`, which stops its session) and the slots it holds
are voided.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from heterorl import failpoints
from heterorl.config import RunConfig
from heterorl.config.fingerprint import differences, fingerprint
from heterorl.durable.journal import Journal
from heterorl.durable.state import SavedState, save_learner_state
from heterorl.frictions import KINDS as FRICTION_KINDS
from heterorl.frictions import frictions_active
from heterorl.learner import Learner
from heterorl.loop.admission import Admission
from heterorl.loop.intake import Intake, IntakeCounters, Verdict
from heterorl.loop.peers import Peers
from heterorl.loop.protocol import GroupVerdict, Reply, Upload
from heterorl.loop.publisher import BackgroundPublisher, WeightTraffic
from heterorl.loop.sampler_figures import SamplerFigures
from heterorl.loop.screen import TrustScreen
from heterorl.loop.screen import verify_key as default_verify_key
from heterorl.loop.staleness import RolloutBuffer, staleness_window
from heterorl.rollout import RolloutGroup
from heterorl.rollout_codec import GroupLimits
from heterorl.run.checkpoints import CheckpointPolicy
from heterorl.run.recorder import RunRecorder
from heterorl.sampler import VERDICT_INFO
from heterorl.weights import Published

FOLLOW_UPS = ("duplicate", "busy", "finished")  # answers to a group that is not its first arrival at the intake
REPLIES_KEPT = 16_384  # answers kept for retried uploads (the same session, seq and groups), oldest forgotten first


def per_sampler_slots(cfg: RunConfig) -> tuple[int, int] | None:
    """The fairness bounds of admission, (share, ceiling): a sampler may hold its share at any time, and up to the
    ceiling out of capacity no other sampler is asking for. `cluster.max_slots_per_sampler` sets both; by default
    the share is an even share of the capacity plus one chunk (so one fast sampler can run ahead a little), and
    the ceiling all of it but one batch (capacity - B, when there is room): the others can always fill a batch. A
    fast sampler behind a long round trip needs about its groups per second x the round trip in flight; on the WAN
    lab through a store (~0.5 s) the even share alone held the near sampler to ~40 groups/s with the learner idle
    65%."""
    cc, B = cfg.cluster, cfg.learner.groups_per_step
    if cc.max_slots_per_sampler is not None:
        return cc.max_slots_per_sampler, cc.max_slots_per_sampler
    caps = [k * B for k in (cc.max_queued_steps, None if cc.eta is None else cc.eta + 1) if k is not None]
    if not caps:
        return None
    capacity, n = min(caps), len(cc.samplers)
    if n == 1:
        return capacity, capacity
    ceiling = max(1, capacity - B if capacity > B else capacity - 1)
    share = min(math.ceil(capacity / n) + math.ceil(B / n), ceiling)
    return share, ceiling


class TrainingDivergedError(RuntimeError):
    """Too many learner steps in a row had a non-finite gradient: stop rather than publish nothing forever."""


@dataclass
class Taken:
    """A batch of groups the learner will train on, and its staleness statistics."""

    groups: list[RolloutGroup]
    stale_stats: dict[str, float]


@dataclass
class StepResult:
    """What one learner step computed (before its version is published)."""

    stats: dict[str, float]
    tokens: int


class LearnerLoop:
    """The learner, its intake, staleness control, publisher and recorder; see the module docstring."""

    def __init__(
        self,
        cfg: RunConfig,
        learner: Learner,
        recorder: RunRecorder,
        clock: Callable[[], float],
        journal: Journal | None = None,
        verify_key: bytes | None = None,
    ) -> None:
        """`verify_key` picks the groups the verifier re-scores (`loop.screen.verify_key`): a live learner passes a
        secret one; by default the simulator's, derived from the run's seed."""
        self.cfg, self.learner, self.recorder, self.clock = cfg, learner, recorder, clock
        self.B = cfg.learner.groups_per_step
        self.publisher = BackgroundPublisher(cfg.weights)
        self.store = self.publisher.store
        self.traffic = WeightTraffic()
        names = cfg.cluster.sampler_names()
        self.peers = Peers(names)
        self.figures = SamplerFigures.of(names)  # per-sampler figures (guarded by the intake's lock)
        self._answers: OrderedDict[tuple[str, str, int], tuple[tuple[str, ...], Reply]] = OrderedDict()
        model_cfg = learner.policy.model.config
        context = int(getattr(model_cfg, "max_position_embeddings", cfg.model.max_positions))
        limits = GroupLimits(
            vocab_size=int(model_cfg.vocab_size),
            current_version=0,
            group_size=cfg.sampler.group_size,
            max_prompt_tokens=context - 1,
            max_completion_tokens=cfg.sampler.max_new_tokens,
            max_total_tokens=context,
            min_logprob=cfg.learner.min_behavior_logprob,
            min_reward=cfg.learner.min_reward,
            max_reward=cfg.learner.max_reward,
        )
        cc = cfg.cluster
        eta, queued = (cc.eta, cc.max_queued_steps) if cc.mode == "async" else (None, None)
        buffer = RolloutBuffer(staleness_window(cc.max_staleness, eta), consume=cc.consume)
        text = learner.policy.text
        self.intake = Intake(
            buffer,
            journal,
            limits,
            cfg.live.max_queued_groups,
            prompt_ids=text.prompt_ids,
            filter_uniform=cfg.learner.dynamic_sampling,
        )
        names = cfg.cluster.sampler_names()
        key = verify_key or default_verify_key(cfg, secret=False)
        self.trust = TrustScreen.from_config(cfg, names, recorder.task, text.decode_completions, self.weights_at, key)
        self.intake.screen = self.trust.check
        self.admission = Admission(eta, self.B, queued, per_sampler_slots(cfg), cc.lease_seconds)
        self.boot = secrets.token_hex(6)  # this learner process: a sampler that sees another one resets its slots
        self.fingerprint = fingerprint(cfg)  # what a sampler's config must agree on (`config.fingerprint`)
        self.on_refusal: Callable[[str, str, str], None] | None = None  # the driver's log of refused uploads
        self.published_version = -1  # the newest version handed to the publisher
        self.served_ceiling = -1  # the newest version an earlier life of this learner may have served (resume)
        self.before_publish: Callable[[int], None] | None = None  # the driver's hook (a durable mark)
        self.published_weights: dict[str, torch.Tensor] = {}  # its wire-dtype tensors (read-only)
        self.busy_seconds = 0.0  # clock seconds spent training
        self.evaluated = False  # the last commit evaluated (`eval.every`): a commit that long (the simulator's cost)
        self.clock_before = 0.0  # clock seconds of earlier lives of this run (resume)
        self.resumes = 0
        self.skipped_steps = 0  # steps with a non-finite gradient (no update applied)
        self.skipped_in_a_row = 0
        self.extra: dict[str, Any] = {}  # the driver's figures for summary.json
        self.checkpoints = CheckpointPolicy(cfg.checkpoint, recorder.run_dir, learner)
        self.needs_initial_eval = True
        self.finish_requested = False

    # ---------------------------------------------------------------- control
    @property
    def done(self) -> bool:
        """Every step is committed (a step being trained is not done yet), or a finish was asked for and no step is
        in flight."""
        if self.published_version >= self.cfg.learner.steps:
            return True
        return self.finish_requested and self.published_version == self.learner.version

    def request_finish(self) -> None:
        """End the run after the step in flight (early stopping): final evaluation, checkpoint and summary."""
        self.finish_requested = True

    def now(self) -> float:
        """Clock seconds since the run started (across resumes)."""
        return self.clock_before + self.clock()

    def start(self) -> None:
        """The initial evaluation (a fresh run) and the publication of the current version."""
        if self.needs_initial_eval:
            self.recorder.evaluate(step=0, clock_time=self.now())
            self.needs_initial_eval = False
        if self.recorder.observer is not None:
            self.recorder.observer.started()
        self.publish()

    def publish(self) -> None:
        """Hand the learner's current version to the publisher (it waits for the previous one first). The exported
        tensors stay readable as `published_weights` (nothing writes to them: in-process samplers may share them)."""
        if self.before_publish is not None:
            self.before_publish(self.learner.version)
        self.published_weights = self.learner.export_weights()
        self.publisher.submit(self.learner.version, self.published_weights)
        self.published_version = self.learner.version

    def weights_at(self, version: int) -> dict[str, torch.Tensor]:
        """A published version's wire-dtype tensors, for the verifier: the newest as exported (its publish may still
        be running), older ones rebuilt by the store (`WeightStore.weights_at`; LookupError when it cannot)."""
        if version == self.published_version:
            return self.published_weights
        # the store must hold every published version first: an older version can be rebuilt only through the
        # patch records of the versions after it, and a version published as a snapshot alone has none, so what
        # can be rebuilt must not hang on whether the publishing thread is done (a simulated run verified a group
        # in one run and found it `unverifiable` in the next: "no patch record for version 1")
        self.publisher.wait()
        return self.store.weights_at(version)

    def offer(self, body: bytes, digest: str | None = None, sender: str | None = None) -> Verdict:
        """One encoded group: accepted, duplicate, filtered, busy, finished, or rejected with its reason; the outcome
        goes to the trust record of `sender` (the uploading sampler, which must be the group's sampler and prefix its
        id), or without one of the group's sampler when it decoded. After a resume, versions an earlier life served
        are not from the future: the learner is about to reproduce them."""
        verdict = self.intake.accept(body, max(self.published_version, self.served_ceiling), digest, sender)
        charged = sender if sender is not None else verdict.sampler
        if charged is not None:
            self.trust.observe(charged, verdict.outcome)
        return verdict

    def exchange(self, upload: Upload) -> Reply:
        """One upload of a sampler session (`loop.protocol`): its groups through the intake, what it gives back,
        its admission request; the reply. Safe to call from several threads.

        A retry (the same session and seq with the same groups: its reply was lost or late) gets the answer the
        upload got, and changes nothing: judged again, a refused group would be charged to its sampler once per
        attempt (an honest sampler on a slow link was quarantined by one borderline group sent four times) and
        settle a slot it had already settled."""
        retry_of = (*upload.key, upload.seq)
        with self.intake.cond:
            kept = self._answers.get(retry_of)
            if kept is not None and kept[0] == upload.digests:
                self.intake.counters.duplicates += len(upload.groups)  # arrived again, not queued again
                return kept[1]
        reply = self._exchange(upload)
        if not reply.refused:  # a whole upload refused is not judged: asking again changes nothing either
            with self.intake.cond:
                self._answers[retry_of] = (upload.digests, reply)
                while len(self._answers) > REPLIES_KEPT:
                    self._answers.popitem(last=False)
        return reply

    def _exchange(self, upload: Upload) -> Reply:
        now = self.now()
        key = upload.key
        if upload.sampler not in self.peers.names:
            return self._refuse(upload, "unknown_sampler", f"{upload.sampler[:64]!r} is not in cluster.samplers")
        differ = differences(self.fingerprint, upload.fingerprint)
        if differ:
            shown = ", ".join(differ[:6]) + (f" and {len(differ) - 6} more" if len(differ) > 6 else "")
            return self._refuse(upload, "config_mismatch", f"settings differ from the learner's: {shown}")
        if self.trust.quarantined(upload.sampler):
            with self.intake.cond:
                self.admission.withdraw(upload.sampler)
            return self._refuse(upload, "quarantined", self.trust.quarantine_detail(upload.sampler))
        published = max(self.published_version, self.served_ceiling)
        if upload.version > published:
            return self._refuse(upload, "future_version", f"claims version {upload.version} > {published}")
        self.peers.heard(
            upload.sampler, upload.version if upload.version >= 0 else None, upload.idle, upload.weights_failed
        )
        verdicts = []
        for body, digest in zip(upload.groups, upload.digests, strict=True):
            verdict = self.offer(body, digest, upload.sampler)
            if verdict.outcome not in FOLLOW_UPS:  # the group's first arrival: it settles one of the session's slots
                with self.intake.cond:
                    self.admission.arrived(key, verdict.outcome == "accepted", now)
                    if verdict.outcome == "accepted":
                        self.figures.accepted(upload.sampler)
            verdicts.append(GroupVerdict(verdict.outcome, verdict.group_id, verdict.detail))
        with self.intake.cond:
            self.admission.reported(key, upload.used, upload.returned, now)
            self.admission.expire(now)
            if not self.admission.enabled:  # nothing to bound: everything asked for is granted
                lease = self.admission.lease(key, now)
                lease.granted = max(lease.granted, upload.wanted)
            elif upload.version >= 0:
                lease = self.admission.grant(key, upload.wanted, upload.version, now, self.intake.buffer.dropped)
            else:  # no weights yet: nothing to generate with, nothing granted
                lease = self.admission.lease(key, now)
            short = lease.granted < upload.wanted
        later = any(v.outcome in ("busy", "disk_full") for v in verdicts)  # sent again: after a wait
        handled = round(max(self.now() - now, 0.0), 6)  # 0 under the simulated clock: the intake costs no time there
        fields = {
            "verdicts": tuple(verdicts),
            "granted": lease.granted,
            "voided": lease.voided_unused,
            "handled": handled,
        }
        return self._reply(upload, short=short or later, **fields)

    def heard(
        self,
        sampler: str,
        session: str | None = None,
        version: int | None = None,
        idle: float | None = None,
        failed: int | None = None,
    ) -> None:
        """A request of a sampler other than an upload (a weight pull): its reports. (It does not renew a lease:
        only delivering groups does, `loop.admission`.)"""
        self.peers.heard(sampler, version, idle, failed)

    def _refuse(self, upload: Upload, reason: str, detail: str) -> Reply:
        """Refuse a whole upload: counted, reported to the driver's hook (a log line), answered with the reason."""
        self.intake.reject(reason, detail)
        if self.on_refusal is not None:
            self.on_refusal(upload.sampler[:64], reason, detail)
        return self._reply(upload, refused=reason, detail=detail)

    def _reply(self, upload: Upload, short: bool = False, **fields: Any) -> Reply:
        retry = self.cfg.cluster.grant_retry_seconds if short or fields.get("refused") else 0.0
        return Reply(
            seq=upload.seq,
            version=self.published_version,
            finished=self.intake.finished,
            retry_after=retry,
            learner=self.boot,
            **fields,
        )

    def release(self, n: int) -> None:
        """n admitted groups will not arrive (the driver knows it: a sampler lost them or went away)."""
        with self.intake.cond:
            self.admission.release(n)

    # ---------------------------------------------------------------- the step
    def take(self, timeout: float = 0.0) -> Taken | None:
        """The next batch: B eligible groups, oldest first, after the window dropped stale ones; None if too few
        (waiting up to `timeout` seconds for them)."""
        taken = self.intake.take(self.B, self.learner.version, timeout)
        if taken is None:
            return None
        with self.intake.cond:
            self.admission.consumed(self.B)
            self.admission.expire(self.now())
            self.figures.trained(taken[0], self.learner.version)
        return Taken(*taken)

    def train(self, taken: Taken) -> StepResult:
        """advantages -> objective -> optimizer step(s) -> version + 1 (`Learner.train_step`)."""
        stats = {**self.learner.train_step(taken.groups), **taken.stale_stats, **verdict_stats(taken.groups)}
        self.trust.poisoned(self.learner.dropped)
        return StepResult(stats, sum(g.num_tokens for g in taken.groups))

    def commit(self, result: StepResult, busy_seconds: float) -> dict[str, Any]:
        """Publish the new version, record the step, evaluate every `eval.every` steps; returns the record."""
        self.busy_seconds += busy_seconds
        previous = self.publisher.result()  # the version before this step's, complete
        assert previous is not None, "start() publishes the first version"
        if self.learner.version >= self.cfg.learner.steps or self.finish_requested:
            self.close_intake()  # before the last version is out: no group made with it could ever be trained
        self.publish()
        self.trust.on_step(self.learner.version)
        skipped = result.stats.get("opt/skipped_updates", 0.0) > 0
        self.skipped_steps += skipped
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
        record = self._record(result.stats, previous)
        accuracy = self.recorder.on_step(record)
        self.evaluated = accuracy is not None  # the step's commit held a held-out evaluation
        self.checkpoints.after_step(self.learner.version, accuracy)
        observer = self.recorder.observer
        if observer is not None and observer.stop_requested:
            self.request_finish()
        limit = self.cfg.learner.max_skipped_steps
        if self.skipped_in_a_row >= limit:
            raise TrainingDivergedError(
                f"{limit} learner steps in a row (the last at version {self.learner.version}) had a non-finite "
                "gradient, so no update was applied and their groups were left out; look for a sampler sending "
                "extreme log-probs or rewards (its log, net/rejected_*), fix it, then resume"
            )
        return record

    def close_intake(self) -> None:
        """From now on every group is answered `finished` (and every reply says so, which ends the sessions). The
        loop closes it as it commits the last step, before that step's version is published: a group arriving
        between the publish and the end of the run would be acknowledged and never trained, on the wall clock
        only (a live run once accepted one group more than its simulated twin)."""
        with self.intake.cond:
            self.intake.finished = True
            self.intake.cond.notify_all()

    def finish(self) -> dict[str, Any]:
        """Close the intake, evaluate the last step if it was not, save the final checkpoint, write summary.json;
        returns the summary."""
        self.close_intake()
        self.publisher.close()
        if self.recorder.last_eval_step != self.learner.version:  # a run finished early
            self.recorder.evaluate(self.learner.version, self.now())
        return self.recorder.finish({**self.extra, **self.summary()})

    # ---------------------------------------------------------------- metrics
    def _record(self, stats: dict[str, float], published: Published) -> dict[str, Any]:
        now = max(self.now(), 1e-9)
        sent, full = self.traffic.take_before(self.learner.version)
        changed = 1.0 if published.changed is None else published.changed / max(published.numel, 1)
        record: dict[str, Any] = {
            "kind": "train",
            "step": self.learner.version,
            "version": self.learner.version,
            "time/clock": now,
            "time/wall": self.recorder.wall(),
            "time/wall_publish": published.seconds,
            "perf/learner_idle": 1.0 - self.busy_seconds / now,
            "perf/tokens_per_sec": self.intake.counters.tokens / now,
            "sync/version": float(published.version),
            "sync/bytes": float(sent),
            "sync/full_bytes": float(full),
            "sync/changed_share": changed,
            **stats,
            **self.intake.metrics(),
            "net/connected": float(len(self.peers.connected(self.cfg.live.connected_seconds))),
            "learner/skipped_steps": float(self.skipped_steps),
        }
        record.update(self.trust.metrics())
        failed = 0
        peers = self.peers.snapshot()
        for name, peer in sorted(peers.items()):
            if peer.version is not None:
                record[f"sampler/{name}/version"] = float(peer.version)
            if peer.idle is not None:
                record[f"sampler/{name}/idle"] = peer.idle
            failed += peer.failed
        record["net/weights_failed_total"] = float(failed)
        with self.intake.cond:
            record.update(self.figures.record(self.learner.version, {n: p.version for n, p in peers.items()}))
        if frictions_active(self.cfg.sampler.frictions):
            info = self.intake.counters.info
            record.update({f"frictions/{kind}_total": float(info[kind]) for kind in FRICTION_KINDS})
        return record

    def full_update_nbytes(self) -> int:
        """Bytes of the newest published state in the wire dtype (what a full update would cost)."""
        published = self.publisher.last_complete
        return 0 if published is None else published.numel * self.learner.wire_dtype.itemsize

    def summary(self) -> dict[str, Any]:
        """The loop's figures for summary.json (seconds are the driving clock's)."""
        now = max(self.now(), 1e-9)
        peers = self.peers.snapshot()
        return {
            "clock_seconds": now,
            **self.intake.buffer.summary(),
            "learner_idle": 1.0 - self.busy_seconds / now,
            "sampler_idle": {n: p.idle for n, p in sorted(peers.items()) if p.idle is not None},
            "tokens_per_clock_second": self.intake.counters.tokens / now,
            "weight_bytes_sent": self.traffic.total_bytes,
            "weight_bytes_full": self.traffic.total_full_bytes,
            "net": {**self.intake.counters_json(), "weights_failed": sum(p.failed for p in peers.values())},
            "resumes": self.resumes,
            "skipped_steps": self.skipped_steps,
            "admission": self.admission_summary(),
            "trust": self.trust.to_json(),
            "per_sampler": self.per_sampler_summary(),
        }

    def per_sampler_summary(self) -> dict[str, Any]:
        """Each sampler's groups accepted and trained, staleness and weights lag (`loop.sampler_figures`)."""
        with self.intake.cond:
            return self.figures.summary()

    def admission_summary(self) -> dict[str, Any]:
        """Admission's totals and each sampler's slots (granted, outstanding, voided)."""
        with self.intake.cond:
            a = self.admission
            return {
                "enabled": a.enabled,
                "granted": a.started,
                "released": a.released,
                "voided": a.voided_total,
                "samplers": a.per_sampler_counts(),
            }

    # ---------------------------------------------------------------- durability (resume)
    def save_state(self, root: Path) -> Path:
        """Write the learner state atomically under `root`, then drop the journal segments it covers. Raises
        OSError (disk full) with the previous state and the journal intact: the caller may try again later."""
        self.recorder.metrics.flush()  # the state's metrics_bytes must cover every step it holds
        queue, consumed, segment = self.intake.checkpoint_view()
        failpoints.hit("checkpoint.rotated")  # a new journal segment, no state for it yet
        buffer = self.intake.buffer
        ids = sorted(consumed)
        with self.intake.cond:
            per_sampler = self.figures.to_json()
        extra = {
            "consumed_ids": ids,
            "consumed_digests": [consumed[i] for i in ids],
            "journal_segment": segment,
            "metrics_bytes": self.recorder.metrics.path.stat().st_size,
            "rewards": self.recorder.rewards,
            "accuracies": self.recorder.accuracies,
            "last_eval_step": self.recorder.last_eval_step,
            "clock": self.now(),
            "wall": self.recorder.wall(),
            "busy_seconds": self.busy_seconds,
            "dropped": buffer.dropped,
            "staleness_hist": {str(k): v for k, v in buffer.staleness_hist.items()},
            "counters": self.intake.counters_json(),
            "traffic": [self.traffic.total_bytes, self.traffic.total_full_bytes],
            "admission": [self.admission.started, self.admission.released, self.admission.trained],
            "resumes": self.resumes,
            "skipped": [self.skipped_steps, self.skipped_in_a_row],
            "trust": self.trust.to_json(),
            "per_sampler": per_sampler,
        }
        path = save_learner_state(self.learner, root, queue=queue, extra=extra)
        assert self.intake.journal is not None
        self.intake.journal.prune(segment)
        return path

    def restore_state(self, saved: SavedState) -> int:
        """Continue from a saved state (the learner itself is already restored): queue, journal, counters,
        clocks, recorder history. Returns the number of groups queued again."""
        x = saved.extra
        journal = self.intake.journal
        assert journal is not None, "resuming needs the journal"
        journaled = list(journal.replay(x["journal_segment"]))
        self.intake.counters = IntakeCounters.from_json(x["counters"])
        digests = x.get("consumed_digests") or [""] * len(x["consumed_ids"])  # "": a state written before digests
        consumed = dict(zip(x["consumed_ids"], digests, strict=True))
        queued = self.intake.restore(consumed, saved.queue, journaled)
        journal.prune(x["journal_segment"])
        buffer = self.intake.buffer
        buffer.dropped = int(x["dropped"])
        buffer.staleness_hist = Counter({int(k): int(v) for k, v in x["staleness_hist"].items()})
        self.recorder.rewards = list(x["rewards"])
        self.recorder.accuracies = list(x["accuracies"])
        self.recorder.last_eval_step = x.get("last_eval_step")
        self.recorder.start = time.monotonic() - float(x["wall"])
        self.clock_before = float(x["clock"])
        self.busy_seconds = float(x["busy_seconds"])
        self.traffic.total_bytes, self.traffic.total_full_bytes = (int(v) for v in x["traffic"])
        # Slots granted before the restart are forgotten (samplers see a new learner and reset theirs): the budget
        # holds what is trained and queued, and groups generated on old slots are charged when they arrive.
        self.admission.trained = int(x["admission"][2])
        self.admission.started = self.admission.trained + queued + buffer.dropped
        self.admission.released = 0
        self.resumes = int(x["resumes"]) + 1
        self.skipped_steps, self.skipped_in_a_row = (int(v) for v in x.get("skipped", [0, 0]))
        self.trust.restore(x.get("trust", {}))
        if "per_sampler" in x:  # absent from states written before per-sampler figures
            self.figures.restore(x["per_sampler"])
        self.needs_initial_eval = False
        return queued


def verdict_stats(groups: list[RolloutGroup]) -> dict[str, float]:
    """`task/unparsable_frac`, `task/timeouts_frac`: the batch's completions whose answer the verifier could not
    read, or whose check ran out of time, as the samplers reported per group (absent with a custom reward)."""
    if not any("unparsable" in g.info for g in groups):
        return {}
    n = sum(g.size for g in groups)
    return {f"task/{key}_frac": sum(g.info.get(key, 0) for g in groups) / n for key in VERDICT_INFO}


def published_stats(published: Published) -> dict[str, Any]:
    """An event-log view of one publication."""
    return {
        "version": published.version,
        "hash": published.state_hash,
        "patch_bytes": published.patch_nbytes,
        "snapshot_bytes": published.snapshot_nbytes,
        "seconds": round(published.seconds, 4),
    }
