"""A sampler node: its session's actions (`loop.session`) carried out through a transport, on a runtime's clock.

The same code runs every sampler, simulated or live: the runtime (`node.runtime`) says how time passes and where
work runs (virtual time and inline calls, or the wall clock, an asyncio loop and worker threads), the transport
(`transport.base.SamplerSide`) how uploads and weight requests travel. Everything the node does is what the session
asked for; it only measures (round trips, generation time, idle share) and logs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from heterorl.loop.protocol import Reply, Upload
from heterorl.loop.session import Generate, Pull, SamplerSession, Send, Wait
from heterorl.loop.worker import HOSTILE_INPUT_ERRORS, SamplerWorker
from heterorl.node.runtime import Runtime
from heterorl.rollout import RolloutGroup
from heterorl.transport.base import FINISHED, SamplerSide
from heterorl.weights.envelope import EnvelopeError, decode_update


class SamplerNode:
    """Drives one session; `on_done` is called once when the session is over (finished or stopped)."""

    def __init__(
        self,
        session: SamplerSession,
        worker: SamplerWorker,
        transport: SamplerSide,
        runtime: Runtime,
        poll_seconds: float,
        emit: Callable[..., None] | None = None,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self.session, self.worker, self.transport, self.runtime = session, worker, transport, runtime
        self.poll_seconds = poll_seconds
        self.emit = emit or (lambda event, **fields: None)
        self.on_done = on_done
        self.started_at = runtime.now()
        self.busy_seconds = 0.0
        self.sent_at: dict[int, float] = {}
        self._closed = False
        self.running = 0  # generations running on the engine
        self._rtt: float | None = None  # smoothed round trip of an upload
        self._spg: float | None = None  # smoothed generation seconds per group

    # ------------------------------------------------------------------ the loop
    def start(self) -> None:
        self.step()

    def step(self) -> None:
        """Carry out what the session asks for now."""
        if self._closed:
            return
        self.session.idle = self.idle()
        self.session.weights_failed = self.worker.failed
        for action in self.session.next_actions():
            if isinstance(action, Pull):
                self._pull()
            elif isinstance(action, Generate):
                self._generate(action.n)
            elif isinstance(action, Send):
                self._send(action.upload)
            elif isinstance(action, Wait):
                self.runtime.call_later(action.seconds, self._timer)
        if self.session.done and not self._closed:
            self._closed = True
            if self.session.stopped:
                self.emit("stopped", reason=self.session.stopped)
            if self.on_done is not None:
                self.on_done()

    def idle(self) -> float:
        elapsed = self.runtime.now() - self.started_at
        return 0.0 if elapsed <= 0.0 else min(max(1.0 - self.busy_seconds / elapsed, 0.0), 1.0)

    def _timer(self) -> None:
        self.session.timer()
        self.step()

    # ------------------------------------------------------------------ weights
    def _pull(self) -> None:
        wait = self.poll_seconds if self.worker.receiver.version is not None else 0.0
        self.transport.pull(self.worker.held, wait, self._pulled)  # held() is read when the request goes out

    def _pulled(self, result: Any) -> None:
        if self._closed:  # the session is over (a pull that was on its way): nothing more to apply or to count
            return
        if result == FINISHED:
            self.session.finish()
            self.session.pulled()
            self.step()
            return
        if result is None:
            self.session.pulled()
            self.step()
            return
        self.runtime.run_blocking(lambda: self._receive(result), self._received)

    def _receive(self, message: Any) -> bool:
        """Decode (bytes) and apply one update; True when the receiver now holds a newer verified version. Its
        `weights` event says how long that took (`apply_s`: the update arrived that long before the event)."""
        began = self.runtime.now()
        failed_before = self.worker.failed
        if isinstance(message, bytes):
            try:
                update = decode_update(message)
            except EnvelopeError as err:
                self.worker.refused(f"envelope: {err}")
                self.emit("weights", ok=False, error=f"envelope: {err}"[:300], bytes=len(message))
                return False
        else:
            update = message
        try:
            ok = self.worker.receive(update)
        except HOSTILE_INPUT_ERRORS as err:  # the worker turns these into refusals; this is belt and braces
            self.worker.refused(f"{type(err).__name__}: {err}"[:300])
            ok = False
        if ok or self.worker.failed != failed_before:
            version, held_hash = self.worker.held()
            nbytes = len(message) if isinstance(message, bytes) else 0
            error = None if ok else self.worker.last_error
            kind = getattr(update, "kind", "shared")
            apply_s = round(self.runtime.now() - began, 4)
            self.emit(
                "weights", ok=ok, version=version, hash=held_hash, kind=kind, bytes=nbytes, error=error, apply_s=apply_s
            )
        return ok

    def _received(self, applied: bool) -> None:
        if applied:
            self.session.weights_received(self.worker.receiver.version)
        self.session.pulled()
        self.step()

    # ------------------------------------------------------------------ generation
    def _generate(self, n: int) -> None:
        # new weights load before a generation starts, unless others still run on an engine that cannot take them
        load = self.running == 0 or self.worker.interruptible
        self.running += 1
        began = self.runtime.now()

        def done(groups: list[RolloutGroup], busy_seconds: float) -> None:
            self.running -= 1
            self.busy_seconds += busy_seconds
            for g in groups:  # unique across restarts of the sampler: its session id
                g.group_id = f"{g.group_id}@{self.session.session_id}"
                g.created_at, g.finished_at = began, self.runtime.now()
            seconds = self.runtime.now() - began
            running = self.session.generating  # this chunk included
            self.emit(
                "generated",
                n=len(groups),
                version=self.worker.version,
                seconds=round(seconds, 3),
                running=running,
                tokens=sum(g.num_tokens for g in groups),  # completion tokens, as `tokens_per_second` counts them
                busy=round(busy_seconds, 4),  # the engine's time for this chunk (shared when chunks overlap)
            )
            if groups:
                self._rtt_hint(seconds_per_group=busy_seconds / len(groups))
            self.session.generated(groups, n)
            self.step()

        self.runtime.generate(self.worker, n, load, done)

    # ------------------------------------------------------------------ uploads
    def _send(self, upload: Upload) -> None:
        self.sent_at[upload.seq] = self.runtime.now()
        self.transport.exchange(upload, lambda reply: self._replied(upload, reply))

    def _replied(self, upload: Upload, reply: Reply | None) -> None:
        sent = self.sent_at.pop(upload.seq, None)
        if reply is None:
            self.session.send_failed(upload.seq)
            self.emit("undeliverable", seq=upload.seq, groups=len(upload.groups))
        else:
            if sent is not None:
                rtt = self.runtime.now() - sent
                self._rtt_hint(rtt=rtt)
                nbytes = sum(len(g) for g in upload.groups)  # the groups' encoded bytes (the upload adds a header)
                self.emit(
                    "replied",
                    seq=upload.seq,
                    groups=len(upload.groups),
                    bytes=nbytes,
                    rtt=round(rtt, 4),
                    handled=round(reply.handled, 4),
                )
            self.session.replied(upload.seq, reply)
            for verdict in reply.verdicts:
                self.emit("pushed", group_id=verdict.group_id, outcome=verdict.outcome)
            if reply.refused:
                self.emit("refused", seq=upload.seq, reason=reply.refused, detail=reply.detail)
        self.step()

    def _rtt_hint(self, rtt: float | None = None, seconds_per_group: float | None = None) -> None:
        """Smoothed round trip and generation time per group (EWMA 1/4, as TCP's SRTT uses 1/8)."""
        if rtt is not None:
            self._rtt = rtt if self._rtt is None else 0.75 * self._rtt + 0.25 * rtt
        if seconds_per_group is not None:
            self._spg = seconds_per_group if self._spg is None else 0.75 * self._spg + 0.25 * seconds_per_group
        if self._rtt is not None and self._spg is not None:
            self.session.observe(self._rtt, self._spg)

    # ------------------------------------------------------------------ end
    def summary(self) -> dict[str, Any]:
        w = self.worker
        return {
            "sampler": w.name,
            "version": w.receiver.version,
            "outcomes": dict(self.session.counts),
            "updates": {"applied": w.applied, "failed": w.failed, "ignored": w.ignored},
            "tokens": w.tokens,
            "idle": round(self.idle(), 4),
            "stopped": self.session.stopped,
        }
