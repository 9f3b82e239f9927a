"""`heterorl learner`: the learner loop driven on the wall clock, serving a live cluster.

The process: a training thread runs the loop's steps back to back (take -> train -> commit,
`heterorl.loop.learner_loop`) while the transports' learner sides feed the same loop -- the HTTP service
(`heterorl.transport.http.service`: weight pulls, uploads through `LearnerLoop.exchange`) and, when configured,
the object store's thread. Signals, the run directory, durability and the end of the run are this module's.

The run directory is the simulated mode's (config.yaml, metrics.jsonl, summary.json, checkpoint/) plus `live/`:
`learner.json` (the URL it listens on, for launchers), `state/` (durable learner states), `journal/` (accepted
groups since the last state), `learner.lock` (held while a learner runs there). The state of version 0 is saved
before the service listens and then every `live.checkpoint_every` steps; `--resume` continues a killed or stopped
learner from its newest state plus the journal, so every acknowledged group is either consumed (trained or
dropped by the window) or queued again, whenever the kill came.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import yaml

from heterorl import failpoints
from heterorl.config import RunConfig, changed_settings
from heterorl.console import Bar, progress_bar
from heterorl.durable.journal import Journal, read_segment, segment_indices
from heterorl.durable.state import (
    latest_state,
    read_version_mark,
    remove_stale_temporaries,
    restore_learner_state,
    write_version_mark,
)
from heterorl.eventlog import EventLog
from heterorl.live.loop_signals import loop_signals
from heterorl.live.preflight import LiveSetupError, check_live_config, parse_listen
from heterorl.live.transports import check_transport_config, open_learner_store
from heterorl.loop.learner_loop import LearnerLoop, TrainingDivergedError, published_stats
from heterorl.loop.sampler_figures import trained_lineage
from heterorl.loop.screen import verify_key
from heterorl.parallel.distributed import attach
from heterorl.run.build import (
    build_learner,
    build_task,
    check_sinks,
    checked_model_path,
    configure_torch,
    resolve_base_model,
)
from heterorl.run.recorder import RunRecorder
from heterorl.run.run_dir import RunDirError, holds_run, new_run_dir, prepare_run_dir
from heterorl.transport.http.auth import Gate, configured_token, new_token
from heterorl.transport.http.service import start_service
from heterorl.transport.identity import CredentialRegistry
from heterorl.transport.store.learner import StoreThreadError
from heterorl.weights.signing import Signer, signer_from

TAKE_POLL_S = 0.5  # how often a waiting training thread re-checks for a stop request
PERSIST_MAX_WAIT_S = 30.0  # longest wait between two tries of a write the disk refused
T = TypeVar("T")


class LiveLearner:
    """The learner process: the loop, its training thread, and what the HTTP service needs to know."""

    def __init__(self, cfg: RunConfig, run_dir: Path, loop: LearnerLoop, events: EventLog) -> None:
        self.cfg, self.run_dir, self.loop, self.events = cfg, run_dir, loop, events
        self.state_root = run_dir / "live" / "state"
        self.checkpoint_version: int | None = None
        self.checkpoint_failed = False  # the last periodic checkpoint could not be written (retry next step)
        self.finished = False
        self.told_finished: set[str] = set()  # samplers that were answered 410
        self.summary: dict[str, Any] | None = None
        self.stop = threading.Event()
        self.notify = lambda: None  # set by the service: wakes long-polls (thread-safe)
        self.signer: Signer | None = None  # signs the weights it serves (`open_learner` sets it)
        self.served_mark = run_dir / "live" / "served.version"
        self.marked = read_version_mark(self.served_mark)
        loop.publisher.on_published.append(self._published)
        loop.before_publish = self._mark_served
        loop.on_refusal = lambda sampler, reason, detail: events.emit(
            "refused", sampler=sampler, reason=reason, detail=detail
        )

    def _mark_served(self, version: int) -> None:
        """Before a version can be served, make it durable that it was: a learner resumed at an older state then
        accepts the samplers' groups of that version (it is about to reproduce it) rather than call them forged."""
        if version > self.marked:
            self.persist(lambda: write_version_mark(self.served_mark, version, self.cfg.live.fsync))
            self.marked = version

    def _published(self, published: Any) -> None:
        self.events.emit("published", **published_stats(published))
        self.notify()

    def request_stop(self) -> None:
        """Finish the current step, checkpoint, return from `train` (SIGTERM / SIGINT): resumable."""
        self.stop.set()
        self.loop.intake.close()

    def request_finish(self) -> None:
        """End the run after the current step, as if it were the last (SIGUSR1): final evaluation and summary."""
        self.loop.request_finish()

    def train(self) -> None:
        """The loop's steps on the wall clock until `learner.steps` or a stop request; checkpoints on the way
        (a checkpoint the disk refuses is tried again after the next step; training goes on meanwhile)."""
        loop, every = self.loop, self.cfg.live.checkpoint_every
        while not loop.done and not self.stop.is_set():
            taken = loop.take(TAKE_POLL_S)
            if taken is None:
                continue
            began = time.monotonic()
            result = loop.train(taken)
            busy = time.monotonic() - began
            failpoints.hit("step.trained")  # trained in memory, not published or recorded
            try:
                loop.commit(result, busy_seconds=busy)
                committed = time.monotonic() - began - busy
            except TrainingDivergedError as err:
                self.persist(self.checkpoint)  # the weights are still finite (nothing applied): resumable once fixed
                loop.publisher.close()
                self.events.emit("stopped", version=loop.learner.version, error=str(err))
                raise
            # the audit trail (which groups of which versions made which version) and the step's cost (calibration):
            # training seconds, then the commit's (publish hand-off, record, and the evaluation when there was one)
            self.events.emit(
                "trained",
                version=loop.learner.version,
                seconds=round(busy, 4),
                commit_seconds=round(committed, 4),
                evaluated=loop.evaluated,
                tokens=result.tokens,
                groups=trained_lineage(taken.groups),
            )
            if result.stats.get("opt/skipped_updates"):
                self.events.emit("skipped_step", version=loop.learner.version, groups=len(taken.groups))
            failpoints.hit("step.committed")  # published and recorded, before any checkpoint
            if (loop.learner.version % every == 0 or self.checkpoint_failed) and not loop.done:
                self.try_checkpoint()
        if loop.done:
            self.finished = True
            loop.close_intake()  # (closed at the last commit already) POSTs get 410: the final state holds them all
            self.notify()  # long-polls answer 410 now
            self.persist(self.checkpoint)  # the final state: every accepted group is consumed or queued
            self.summary = self.persist(loop.finish)
            self.events.emit("finished", version=loop.learner.version, elapsed=round(loop.now(), 3))
        else:
            self.persist(self.checkpoint)  # stopped early: durable state for --resume
            loop.publisher.close()

    def checkpoint(self) -> Path:
        path = self.loop.save_state(self.state_root)
        self.checkpoint_version = self.loop.learner.version
        self.checkpoint_failed = False
        self.events.emit("checkpoint", version=self.loop.learner.version, path=str(path))
        return path

    def try_checkpoint(self) -> Path | None:
        """A periodic checkpoint; a disk that refuses it (full) is logged and the next step tries again. Nothing
        is lost meanwhile: the previous state and the journal hold every acknowledged group."""
        try:
            return self.checkpoint()
        except OSError as err:
            self.checkpoint_failed = True
            self.events.emit("checkpoint_failed", version=self.loop.learner.version, error=str(err))
            return None

    def persist(self, write: Callable[[], T]) -> T:
        """`write()` (a state, the final checkpoint and summary), retried while the disk refuses it, with waits of
        1 s doubling to 30 s, until it succeeds or a stop is requested (then the OSError is raised)."""
        delay = 1.0
        while True:
            try:
                return write()
            except OSError as err:
                self.events.emit("write_failed", version=self.loop.learner.version, error=str(err), retry_s=delay)
                if self.stop.wait(delay):
                    raise
                delay = min(2 * delay, PERSIST_MAX_WAIT_S)

    def status(self) -> dict[str, Any]:
        """GET /v1/status: progress, queue, counters, samplers."""
        loop, window = self.loop, self.cfg.live.connected_seconds
        return {
            "version": loop.store.latest_version,
            "state_hash": loop.store.latest_hash,
            "steps": loop.learner.version,
            "target_steps": self.cfg.learner.steps,
            "finished": self.finished,
            "checkpoint_version": self.checkpoint_version,
            "queue": len(loop.intake.buffer),
            **loop.intake.counters_json(),
            "groups_dropped": loop.intake.buffer.dropped,
            "connected": loop.peers.connected(window),
            "samplers": loop.peers.status(window),
            "elapsed_s": round(loop.now(), 3),
            "resumes": loop.resumes,
            "skipped_steps": loop.skipped_steps,
            "trust": loop.trust.to_json(),  # every sampler's record: accepted, refused by reason, quarantine
            "admission": loop.admission_summary()["samplers"],
        }


def _check_run_dir(cfg: RunConfig, run_dir: Path, resume: bool) -> bool:
    """Whether to resume from the run directory's state. A fresh start over a state, or a resume with another
    config, is refused. A directory without a state holds no acknowledged group (the learner saves its version-0
    state before it listens), so a learner killed before that starts afresh, --resume or not."""
    state_root, journal = run_dir / "live" / "state", run_dir / "live" / "journal"
    state = latest_state(state_root)
    if state is None:
        records = sum(len(read_segment(journal / f"{i:08d}.journal")) for i in segment_indices(journal))
        if records:
            raise LiveSetupError(
                f"{journal} holds {records} acknowledged groups but {state_root} no learner state to replay them "
                "on; restore the state directory, or start in a new run directory"
            )
        shutil.rmtree(journal, ignore_errors=True)  # empty segments of a learner that never listened,
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)  # and its initial evaluation: all redone now
        (run_dir / "live" / "served.version").unlink(missing_ok=True)
        return False
    if not resume:
        raise LiveSetupError(f"{run_dir} already holds a live learner; pass --resume or use a new run directory")
    check_same_config(cfg, run_dir)
    return True


def check_same_config(cfg: RunConfig, run_dir: Path) -> None:
    """A resume continues the run as it was configured: only the `live` section (ports, timeouts) may change."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise LiveSetupError(f"--resume: {path} is missing (the config the run was started with)")
    saved_cfg = RunConfig.model_validate(yaml.safe_load(path.read_text()))
    changed = changed_settings(saved_cfg, cfg)
    if changed:
        raise LiveSetupError(
            f"--resume: the config differs from {path} in {', '.join(changed[:5])}"
            f"{f' and {len(changed) - 5} more' if len(changed) > 5 else ''} (only `live` may change)"
        )


@contextlib.contextmanager
def run_dir_lock(run_dir: Path) -> Iterator[None]:
    """Hold `live/learner.lock` for as long as this learner runs: two learners on one directory would interleave
    journals and states. The kernel drops the lock when the process dies, so a kill -9 leaves none behind."""
    path = run_dir / "live" / "learner.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise LiveSetupError(f"{run_dir} is in use by a running learner ({holder}); stop it first") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}")
        f.flush()
        yield


def _truncate(path: Path, nbytes: int) -> None:
    """Cut metrics.jsonl back to the checkpoint: the records of steps that are redone after a resume go."""
    if path.is_file() and path.stat().st_size > nbytes:
        with path.open("r+b") as f:
            f.truncate(nbytes)


def resolve_learner_token(cfg: RunConfig) -> str:
    """The configured token, or a fresh one announced on stderr (samplers need it)."""
    token = configured_token(cfg.live)
    if token is None:
        token = new_token()
        print(
            f"heterorl learner: no token in ${cfg.live.token_env} or live.token_file; generated one:\n"
            f"  {token}\nStart samplers with {cfg.live.token_env} set to it.",
            file=sys.stderr,
            flush=True,
        )
    return token


def resolve_learner_gate(cfg: RunConfig) -> Gate:
    """Who may call the service: each sampler's own token from `trust.credentials`, else the run's one token."""
    if cfg.trust.credentials is not None:
        return Gate(credentials=CredentialRegistry(cfg.trust.credentials))
    return Gate(token=resolve_learner_token(cfg))


def open_learner(
    cfg: RunConfig,
    run_dir: Path,
    base: str,
    resume: bool = False,
    events: EventLog | None = None,
    bar: Bar | None = None,
) -> LiveLearner:
    """The learner process's loop over `run_dir`: fresh from `base`, or (resume) from the newest saved state plus
    the journal. Call `loop.start()` next, then serve it."""
    saved = None
    for stale in remove_stale_temporaries(run_dir / "live" / "state"):  # a save killed half-way
        (events or EventLog()).emit("removed_stale", path=str(stale))
    if resume:
        path = latest_state(run_dir / "live" / "state")
        if path is None:
            raise LiveSetupError(f"--resume: no learner state under {run_dir / 'live' / 'state'}")
        learner = build_learner(cfg, base)  # as first built: frozen parts and the KL reference are the base's
        try:
            saved = restore_learner_state(learner, path)
        except ValueError as err:  # another format, or weights of another model: a setup mistake, not a crash
            raise LiveSetupError(f"--resume: {err}") from None
        _truncate(run_dir / "metrics.jsonl", int(saved.extra["metrics_bytes"]))
    else:
        learner = build_learner(cfg, base)
    attach(learner)  # with several ranks: rank 0 shares it (heterorl.parallel.distributed); else nothing
    bar = bar or Bar(None, None)
    if saved is not None:
        bar.advance(saved.version)
    recorder = RunRecorder(cfg, run_dir, learner, build_task(cfg), bar)
    clock_start = time.monotonic()
    journal = Journal(run_dir / "live" / "journal", fsync=cfg.live.fsync)
    key = verify_key(cfg, secret=True)  # which groups are re-scored: samplers must not be able to tell
    loop = LearnerLoop(
        cfg, learner, recorder, clock=lambda: time.monotonic() - clock_start, journal=journal, verify_key=key
    )
    events = events or EventLog()
    live = LiveLearner(cfg, run_dir, loop, events)
    loop.served_ceiling = live.marked
    if saved is not None:
        queued = loop.restore_state(saved)
        live.checkpoint_version = saved.version
        events.emit("resumed", version=saved.version, queued=queued, path=str(saved.path))
    # the learner's signing key in this life's epoch (the resumes so far): samplers never go back in (epoch, version)
    live.signer = signer_from(cfg.trust.learner_private_key, loop.resumes)
    return live


def serve_learner(
    cfg: RunConfig,
    listen: str = "127.0.0.1:8470",
    run_dir: str | Path | None = None,
    resume: bool = False,
    show_progress: bool = True,
    progress_log: bool = True,
) -> dict[str, Any] | None:
    """Run the learner service until `learner.steps` (-> the summary, also in summary.json) or a stop signal
    (-> None; the state is saved and `resume=True` continues it)."""
    wall_start = time.monotonic()
    host, port = parse_listen(listen)
    check_live_config(cfg)
    check_transport_config(cfg)
    checked_model_path(cfg)
    if run_dir is None:
        if resume:
            raise LiveSetupError("--resume needs --run-dir")
        run_dir = new_run_dir(name="live")
    run_dir = Path(run_dir)
    if holds_run(run_dir) and not (run_dir / "live").is_dir():
        raise RunDirError(f"{run_dir} holds a run that is not a live learner's; choose another --run-dir")
    with run_dir_lock(run_dir):
        resume = _check_run_dir(cfg, run_dir, resume)
        gate = resolve_learner_gate(cfg)
        run_dir = prepare_run_dir(cfg, run_dir, resume=resume)
        address = run_dir / "live" / "learner.json"
        address.unlink(missing_ok=True)
        check_sinks(cfg)
        configure_torch(cfg)
        base, pretrain_info = resolve_base_model(cfg, show_progress)
        log = run_dir / "run.log" if progress_log else None  # under `run --live` the launcher writes run.log
        with progress_bar("RL", total=cfg.learner.steps, enabled=show_progress, log_path=log) as bar:
            live = open_learner(cfg, run_dir, base, resume=resume, bar=bar)
            live.loop.extra = {"base_model": str(base), "pretrain": pretrain_info, "clock": "wall"}
            store = open_learner_store(live, resume)  # weights out / rollouts in through a store, when configured
            live.loop.start()  # the initial evaluation (fresh runs) and the current version's publication
            if not resume:
                try:
                    live.checkpoint()  # version 0 on disk before the first group can be acknowledged
                except OSError as err:
                    raise LiveSetupError(
                        f"cannot write the learner's first state under {live.state_root}: {err}"
                    ) from None
            if store is not None:
                store.start()
            try:
                asyncio.run(_serve(live, gate, host, port, address))
            finally:
                if store is not None:
                    store.close()  # after the last version's upload and the `finished` marker
                    live.events.emit("store", **store.summary())
                    if live.summary is not None:  # the summary was taken before the last upload finished
                        traffic = live.loop.traffic
                        live.summary.update(weight_bytes_sent=traffic.total_bytes, store=store.summary())
                        live.summary["weight_bytes_full"] = traffic.total_full_bytes
            if store is not None and store.error is not None:
                raise StoreThreadError(f"the learner's store thread stopped the run ({store.error}); fix it, --resume")
    if live.summary is None:
        return None
    summary = {**live.summary, "wall_seconds": time.monotonic() - wall_start}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


async def _serve(live: LiveLearner, gate: Gate, host: str, port: int, address_file: Path) -> None:
    """Serve until the training thread returns (done, or stopped by SIGTERM/SIGINT; SIGUSR1 finishes early; SIGHUP
    reloads `trust.credentials`); the URL goes to `address_file`. After the last step, answer until every sampler
    was told, at most `linger_s`."""
    runner, url = await start_service(live, gate, host, port)
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="train")
    try:
        tmp = address_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
        tmp.replace(address_file)
        # elapsed: the loop clock's seconds at this moment, so a reader can place the clock's zero on the host clock
        live.events.emit("listening", url=url, version=live.loop.learner.version, elapsed=round(live.loop.now(), 3))
        handlers = {
            signal.SIGTERM: live.request_stop,
            signal.SIGINT: live.request_stop,
            signal.SIGUSR1: live.request_finish,
        }
        if gate.credentials is not None:
            handlers[signal.SIGHUP] = gate.credentials.request_reload
        with loop_signals(handlers):
            await loop.run_in_executor(pool, live.train)
            if live.finished:
                await _linger(live)
    finally:
        live.request_stop()
        pool.shutdown(wait=True)
        await runner.cleanup()


async def _linger(live: LiveLearner) -> None:
    """After the last step, answer until every sampler of the run has been told (410), at most `linger_s`. Every
    configured one, not only those heard from lately: after a resume the run may end before a sampler retrying in
    its backoff has reconnected, and it would then retry until `patience_s`."""
    deadline = time.monotonic() + live.cfg.live.linger_s
    while time.monotonic() < deadline:
        if live.loop.peers.names <= live.told_finished:
            return
        await asyncio.sleep(0.05)
