"""The live learner: the real Learner trained on rollout groups that arrive over HTTP, on the wall clock.

The same step as the simulated cluster, driven by a different clock: a training thread waits for
`groups_per_step` eligible groups in the shared `RolloutBuffer` (staleness window included), trains them,
publishes the new version into the WeightStore (through `BackgroundPublisher`), wakes the samplers waiting for
it, records the step (the simulated driver's metric keys, with `time/virtual` = wall seconds, plus `live/*`),
evaluates every `eval.every` steps and checkpoints every `live.checkpoint_every` steps. The HTTP service
(`service.py`) runs on the event loop beside it; both share the `Intake` under its lock.

Publishing happens before the step is recorded: samplers get the new version as soon as it exists, and the
bookkeeping (metrics, evaluation, checkpoint) overlaps their generation instead of delaying the weights.

Resume: the state directory holds the learner (weights, optimizer, scheduler, RNG, version), the queue, the
consumed group ids and the journal segment that follows them; the journal from that segment on is replayed,
so every acknowledged group is either consumed (trained or dropped by the window) or queued again.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from heterorl.config import RunConfig
from heterorl.learner import Learner
from heterorl.live.eventlog import EventLog
from heterorl.loop.intake import Intake, IntakeCounters
from heterorl.loop.journal import Journal
from heterorl.loop.peers import Peers
from heterorl.loop.publisher import BackgroundPublisher
from heterorl.loop.staleness import RolloutBuffer
from heterorl.loop.state import SavedState, save_learner_state
from heterorl.rollout_codec import GroupLimits
from heterorl.run import RunRecorder
from heterorl.weights import Published

TAKE_POLL_S = 0.5  # how often a waiting training thread re-checks for a stop request


def _nothing() -> None:
    return None


class LiveLearner:
    """The learner process's state and its training loop (`train`, run in a worker thread)."""

    def __init__(
        self,
        cfg: RunConfig,
        run_dir: Path,
        learner: Learner,
        recorder: RunRecorder,
        events: EventLog,
        saved: SavedState | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.cfg, self.run_dir, self.learner, self.recorder, self.events = cfg, run_dir, learner, recorder, events
        self.live_dir = run_dir / "live"
        self.state_root = self.live_dir / "state"
        self.publisher = BackgroundPublisher(cfg.weights)
        self.store = self.publisher.store
        self.peers = Peers()
        limits = GroupLimits(
            vocab_size=int(learner.policy.model.config.vocab_size),
            current_version=0,
            group_size=cfg.sampler.group_size,
            max_prompt_tokens=cfg.model.max_positions,
            max_completion_tokens=cfg.sampler.max_new_tokens,
        )
        journal = Journal(self.live_dir / "journal", fsync=cfg.live.fsync)
        buffer = RolloutBuffer(cfg.cluster.max_staleness)
        self.intake = Intake(buffer, journal, limits, cfg.live.max_queued_groups)
        self.extra = extra or {}
        self._traffic_lock = threading.Lock()
        self.traffic = {"sent": 0, "full": 0, "step_sent": 0, "step_full": 0}
        self.busy_seconds = 0.0
        self.elapsed_before = 0.0
        self.start = time.monotonic()
        self.resumes = 0
        self.checkpoint_version: int | None = None
        self.last_published: Published | None = None
        self.finished = False
        self.told_finished: set[str] = set()  # samplers that were answered 410
        self.summary: dict[str, Any] | None = None
        self.stop = threading.Event()
        self.on_publish: Callable[[], None] = _nothing  # set by the service: wakes long-polls (thread-safe)
        self.needs_initial_eval = saved is None
        if saved is not None:
            self._restore(saved)

    # ---------------------------------------------------------------- clock and control
    def elapsed(self) -> float:
        """Wall seconds of training so far, across restarts (the live mode's `time/virtual`)."""
        return self.elapsed_before + time.monotonic() - self.start

    def request_stop(self) -> None:
        """Finish the current step, checkpoint, return from `train` (SIGTERM / SIGINT)."""
        self.stop.set()
        self.intake.close()

    def count_served(self, nbytes: int) -> None:
        """Account one weight update sent (and what the full weights would have cost)."""
        full = 0 if self.last_published is None else self.last_published.numel * self.learner.wire_dtype.itemsize
        with self._traffic_lock:
            self.traffic["sent"] += nbytes
            self.traffic["step_sent"] += nbytes
            self.traffic["full"] += full
            self.traffic["step_full"] += full

    # ---------------------------------------------------------------- the loop
    def publish(self) -> Published:
        """Publish the learner's current version, then wake the samplers waiting for it."""
        self.publisher.submit(self.learner.version, self.learner.export_weights())
        published = self.publisher.result()
        assert published is not None, "a publish always yields a result"
        self.last_published = published
        self.events.emit(
            "published",
            version=published.version,
            hash=published.state_hash,
            patch_bytes=published.patch_nbytes,
            snapshot_bytes=published.snapshot_nbytes,
            seconds=round(published.seconds, 4),
        )
        self.on_publish()
        return published

    def train(self) -> None:
        """Batches -> steps -> publish -> record -> checkpoint, until `learner.steps` or a stop request."""
        if self.needs_initial_eval:
            self.recorder.evaluate(step=0, clock_time=0.0)
            self.needs_initial_eval = False
        steps, every = self.cfg.learner.steps, self.cfg.live.checkpoint_every
        while self.learner.version < steps and not self.stop.is_set():
            taken = self.intake.take(self.cfg.learner.groups_per_step, self.learner.version, TAKE_POLL_S)
            if taken is None:
                continue
            batch, stale_stats = taken
            began = time.monotonic()
            stats = self.learner.train_step(batch)
            self.busy_seconds += time.monotonic() - began
            published = self.publish()
            self.recorder.on_step(self._record({**stats, **stale_stats}, published))
            if self.learner.version % every == 0 and self.learner.version < steps:
                self.checkpoint()
        if self.learner.version >= steps:
            self._finish()
        else:
            self.checkpoint()  # stopped early: durable state for --resume
        self.publisher.close()

    def _finish(self) -> None:
        with self.intake.cond:
            self.intake.finished = True
        self.finished = True
        self.on_publish()  # long-polls answer 410 now
        self.checkpoint()  # the final state: every accepted group is consumed or queued
        self.summary = self.recorder.finish(self.summary_extra())
        self.events.emit("finished", version=self.learner.version, elapsed=round(self.elapsed(), 3))

    # ---------------------------------------------------------------- metrics
    def _record(self, stats: dict[str, float], published: Published) -> dict[str, Any]:
        now = max(self.elapsed(), 1e-9)
        with self._traffic_lock:
            sent, full = self.traffic["step_sent"], self.traffic["step_full"]
            self.traffic["step_sent"] = self.traffic["step_full"] = 0
        changed = 1.0 if published.changed is None else published.changed / max(published.numel, 1)
        record: dict[str, Any] = {
            "kind": "train",
            "step": self.learner.version,
            "version": self.learner.version,
            "time/virtual": now,
            "time/wall": now,
            "perf/learner_idle": 1.0 - self.busy_seconds / now,
            "perf/tokens_per_vsec": self.intake.counters.tokens / now,
            "sync/version": float(published.version),  # the version changed_share and publish time describe
            "sync/bytes": float(sent),
            "sync/full_bytes": float(full),
            "sync/changed_share": changed,
            "time/wall_publish": published.seconds,
            **stats,
            **self.intake.metrics(),
            "live/connected": float(len(self.peers.connected(self.cfg.live.connected_seconds))),
        }
        for name, peer in self.peers.snapshot().items():
            if peer.version is not None:
                record[f"sampler/{name}/version"] = float(peer.version)
            if peer.idle is not None:
                record[f"sampler/{name}/idle"] = peer.idle
        return record

    def summary_extra(self) -> dict[str, Any]:
        """The driver's figures for summary.json (same keys as the simulated cluster; seconds are wall seconds)."""
        now = max(self.elapsed(), 1e-9)
        counters = self.intake.counters_json()
        peers = self.peers.snapshot()
        with self._traffic_lock:
            sent, full = self.traffic["sent"], self.traffic["full"]
        return {
            **self.extra,
            "virtual_seconds": now,
            **self.intake.buffer.summary(),
            "learner_idle": 1.0 - self.busy_seconds / now,
            "sampler_idle": {n: p.idle for n, p in sorted(peers.items()) if p.idle is not None},
            "tokens_per_virtual_second": counters["tokens"] / now,
            "weight_bytes_sent": sent,
            "weight_bytes_full": full,
            "live": {**counters, "resumes": self.resumes},
        }

    def status(self) -> dict[str, Any]:
        """GET /v1/status: progress, queue, counters, samplers."""
        counters = self.intake.counters_json()
        window = self.cfg.live.connected_seconds
        return {
            "version": self.store.latest_version,
            "state_hash": self.store.latest_hash,
            "steps": self.learner.version,
            "target_steps": self.cfg.learner.steps,
            "finished": self.finished,
            "checkpoint_version": self.checkpoint_version,
            "queue": len(self.intake.buffer),
            **counters,
            "groups_dropped": self.intake.buffer.dropped,
            "connected": self.peers.connected(window),
            "samplers": self.peers.status(window),
            "elapsed_s": round(self.elapsed(), 3),
            "resumes": self.resumes,
        }

    # ---------------------------------------------------------------- durability
    def checkpoint(self) -> Path:
        """Write the learner state atomically, then drop the journal segments it covers."""
        queue, consumed, segment = self.intake.checkpoint_view()
        buffer = self.intake.buffer
        with self._traffic_lock:
            traffic = {"sent": self.traffic["sent"], "full": self.traffic["full"]}
        extra = {
            "consumed_ids": consumed,
            "journal_segment": segment,
            "metrics_bytes": self.recorder.metrics.path.stat().st_size,
            "rewards": self.recorder.rewards,
            "accuracies": self.recorder.accuracies,
            "elapsed": self.elapsed(),
            "busy_seconds": self.busy_seconds,
            "dropped": buffer.dropped,
            "staleness_hist": {str(k): v for k, v in buffer.staleness_hist.items()},
            "counters": self.intake.counters_json(),
            "traffic": traffic,
            "resumes": self.resumes,
        }
        path = save_learner_state(self.learner, self.state_root, queue=queue, extra=extra)
        self.intake.journal.prune(segment)
        self.checkpoint_version = self.learner.version
        self.events.emit("checkpoint", version=self.learner.version, queued=len(queue), path=str(path))
        return path

    def _restore(self, saved: SavedState) -> None:
        x = saved.extra
        journaled = list(self.intake.journal.replay(x["journal_segment"]))
        self.intake.counters = IntakeCounters.from_json(x["counters"])
        queued = self.intake.restore(x["consumed_ids"], saved.queue, journaled)
        self.intake.journal.prune(x["journal_segment"])
        buffer = self.intake.buffer
        buffer.dropped = int(x["dropped"])
        buffer.staleness_hist = Counter({int(k): int(v) for k, v in x["staleness_hist"].items()})
        self.recorder.rewards = list(x["rewards"])
        self.recorder.accuracies = list(x["accuracies"])
        self.elapsed_before = float(x["elapsed"])
        self.recorder.start = self.start - self.elapsed_before
        self.busy_seconds = float(x["busy_seconds"])
        self.traffic.update(x["traffic"])
        self.resumes = int(x["resumes"]) + 1
        self.checkpoint_version = saved.version
        self.events.emit(
            "resumed", version=saved.version, queued=queued, journaled=len(journaled), path=str(saved.path)
        )
