"""The learner's side of the store, beside its HTTP service: weights out (`StorePublisher`), uploads in and
replies out (`StoreIntake`), the samplers' heartbeats, and the `finished` marker -- in one thread that looks at the
store again at once after it found uploads and at spacings doubling up to `poll_seconds` while it finds none
(`Cadence`), backing off while the store is away (each failed round counted as `outage`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from heterorl.config import RunConfig
from heterorl.eventlog import EventLog
from heterorl.loop.learner_loop import LearnerLoop
from heterorl.transport.identity import CredentialRegistry
from heterorl.transport.store.cadence import Cadence
from heterorl.transport.store.intake import IO_THREADS, StoreIntake, read_heartbeats
from heterorl.transport.store.manifest import UPLOADS
from heterorl.transport.store.objects import ObjectStore, StoreSetupError, StoreUnavailable
from heterorl.transport.store.publisher import StorePublisher
from heterorl.weights.signing import signing_key_from

MAX_BACKOFF_S = 30.0


class StoreThreadError(RuntimeError):
    """The learner's store thread ended on an error no retry fixes (a store that refuses the learner's requests, a
    bug): the run stopped, resumable, and says why in one line."""


class StoreLearnerSide:
    """Everything the learner does with the store; `is_finished` says when the last step is done."""

    def __init__(
        self,
        cfg: RunConfig,
        loop: LearnerLoop,
        objects: ObjectStore,
        *,
        resume: bool,
        is_finished: Callable[[], bool],
        events: EventLog,
        on_finished: Callable[[], None] = lambda: None,
        on_failed: Callable[[], None] = lambda: None,
    ) -> None:
        self.cfg, self.loop, self.objects, self.events = cfg, loop, objects, events
        self.is_finished, self.on_finished, self.on_failed = is_finished, on_finished, on_failed
        self.error: str | None = None  # why the store thread ended early (`on_failed` was called)
        store_cfg = cfg.transport.store
        self.poll_s = store_cfg.poll_seconds
        self.counts: Counter[str] = Counter()
        self.publisher: StorePublisher | None = None
        self.intake: StoreIntake | None = None
        key = signing_key_from(cfg.trust.learner_private_key)  # signs every object, manifest and reply, when set
        if cfg.transport.weights == "store":
            self.publisher = StorePublisher(
                objects, loop.store, store_cfg, resume=resume, on_uploaded=self._uploaded, signing_key=key
            )
            loop.publisher.on_published.append(self.publisher.published)
        elif not resume and objects.list(UPLOADS):
            raise StoreSetupError(f"{objects.url} already holds uploads: use a new prefix for every run")
        if cfg.transport.rollouts == "store":
            credentials = None if cfg.trust.credentials is None else CredentialRegistry(cfg.trust.credentials)
            self.intake = StoreIntake(
                objects,
                loop,
                cfg.live.max_body_bytes,
                cfg.cluster.groups_per_upload,
                credentials,
                workers=store_cfg.intake_workers,
                signing_key=key,
                io_threads=IO_THREADS,
            )
        self.cadence = Cadence.of(store_cfg, answer_due=True)
        self._heartbeats: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store", daemon=True)

    def _uploaded(self, version: int, nbytes: int, full_nbytes: int) -> None:
        self.loop.traffic.sent(version, nbytes, full_nbytes)  # the learner's egress: each object once
        self.events.emit("uploaded", version=version, bytes=nbytes)

    def start(self) -> None:
        if self.publisher is not None:
            self.publisher.start()
        self._thread.start()

    def _run(self) -> None:
        """The thread: `_serve` until the run is finished; an error it cannot retry stops the run (`on_failed`)
        rather than leaving the learner waiting for groups that no longer come in."""
        try:
            self._serve()
        except Exception as err:  # whatever it was, the run must not hang on a dead intake
            self.error = f"{type(err).__name__}: {err}"[:500]
            self.events.emit("store", fault="failed", detail=self.error)
            self.on_failed()

    def _serve(self) -> None:
        delay = self.poll_s
        beats_at = 0.0
        while not self._stop.is_set():
            looked_at = time.monotonic()
            try:
                handled = self.intake.poll() if self.intake is not None else 0
                if time.monotonic() - beats_at >= self.poll_s:  # heartbeats change slowly: every poll_seconds
                    read_heartbeats(self.objects, self.loop, self._heartbeats)
                    beats_at = time.monotonic()
            except StoreUnavailable as err:
                self.counts["outage"] += 1
                self.events.emit("store", fault="outage", detail=str(err)[:300])
                delay = min(2 * delay, MAX_BACKOFF_S)
                self._stop.wait(delay)
                continue
            delay = self.poll_s
            if self.is_finished():
                self._finish()
                return
            self._stop.wait(self.cadence.found() if handled else self.cadence.nothing(time.monotonic() - looked_at))

    def _finish(self) -> None:
        """Upload the last version, then write the `finished` marker (store samplers stop on it)."""
        if self.publisher is None:
            return
        deadline = time.monotonic() + 30.0
        while self.publisher.last_queued < self.loop.published_version and time.monotonic() < deadline:
            time.sleep(0.01)  # the final publish's callback has not queued its version yet
        ok = self.publisher.finish(self.loop.learner.version, timeout_s=self.cfg.live.patience_s)
        self.events.emit("store_finished", ok=ok, version=self.loop.learner.version)
        if ok:
            self.on_finished()

    def summary(self) -> dict[str, Any]:
        """Counts for summary.json / status: objects uploaded and bytes, intake outcomes, outages."""
        out: dict[str, Any] = {"outages": self.counts["outage"]}
        if self.publisher is not None:
            out["uploaded_bytes"] = self.publisher.uploaded_bytes
            out["publisher"] = dict(self.publisher.counts)
        if self.intake is not None:
            out["intake"] = dict(self.intake.counts)
            out["downloaded_bytes"] = self.intake.downloaded
        return out

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.cfg.live.patience_s + 60)
        if self.publisher is not None:
            self.publisher.close()
        if self.intake is not None:
            self.intake.close()
