"""The learner's HTTP service (aiohttp): samplers pull weights and push rollout groups; anyone reads status.

    GET  /v1/weights?version=V&hash=H&wait=S&sampler=NAME&idle=X&failed=F    bearer token
         200: a weight-update envelope (envelope.py): the store's smallest correct update from (V, H) -- patch,
              merged patch, or snapshot (+ patch). No V/H: a snapshot.
         204: V/H is the newest version; the request first waits up to min(S, live.poll_seconds) for a newer one
         410: the run is finished;  503: nothing published yet
    POST /v1/rollouts?sampler=NAME                                   bearer token
         body: one `encode_group` message; optional header X-Heterorl-Digest: its xxh3-128 (hex)
         200 {"outcome": "accepted" | "duplicate"};  410 finished;
         503 busy (queue full, retry later);  401 / 413 / 400 / 422 rejections (intake.py has the table)
    POST /v1/admission?sampler=NAME&n=N&version=V                    bearer token
         200 {"outcome": "granted"}: the sampler may generate N groups with weights of version V;
         429 {"outcome": "wait", "retry_after": S}: over AReaL's budget (`cluster.eta`), ask again later;
         410 finished. Without `cluster.eta` every request is granted.
    GET  /v1/status                                                  public: JSON progress and counters

The service speaks plain HTTP; put it behind a TLS-terminating reverse proxy off a trusted network
(docs/deployment.md). CPU work (update merging, group decoding, journaling) runs in worker threads so the
event loop keeps answering while the training thread computes. The HTTP layer's own limits (connections,
header and idle timeouts, counted parse errors) are in `guard.py`; a rollout body must arrive within
`live.body_timeout_s` (else 408 `timeout`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from heterorl.config import RunConfig
from heterorl.loop.learner_loop import LearnerLoop
from heterorl.rollout_codec import max_message_bytes
from heterorl.transport.http.auth import bearer_matches
from heterorl.transport.http.guard import Guard, GuardedRunner
from heterorl.weights.envelope import encode_update


class LearnerEndpoint(Protocol):
    """What the service serves: the learner process's loop and its run state (`heterorl.live.learner_node`)."""

    cfg: RunConfig
    loop: LearnerLoop
    events: EventLog
    finished: bool
    told_finished: set[str]
    notify: Callable[[], None]

    def status(self) -> dict[str, Any]: ...
    def train(self) -> None: ...
    def request_stop(self) -> None: ...
    def request_finish(self) -> None: ...


class EventLog(Protocol):
    def emit(self, event: str, **fields: Any) -> None: ...


DIGEST_HEADER = "X-Heterorl-Digest"
_NAME = re.compile(r"^[\w.:@/-]{1,128}$")
_HASH = re.compile(r"^[0-9a-f]{1,128}$")
LIVE_KEY = web.AppKey("live", object)


class Notifier:
    """Wakes long-polls when a version is published or the run finishes (callable from any thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()

    def notify_threadsafe(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
            self.loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        self.event.set()
        self.event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout)


NOTIFIER_KEY = web.AppKey("notifier", Notifier)


class QueryError(ValueError):
    """A query parameter that does not parse."""


def _query_int(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if not value.isdigit() or len(value) > 12:
        raise QueryError(f"expected a non-negative integer, got {value[:20]!r}")
    return int(value)


def _query_float(value: str | None, low: float, high: float) -> float | None:
    if value is None or value == "":
        return None
    try:
        x = float(value)
    except ValueError:
        raise QueryError(f"expected a number, got {value[:20]!r}") from None
    if not math.isfinite(x) or not low <= x <= high:
        raise QueryError(f"{x} is outside [{low}, {high}]")
    return x


def _query_match(value: str | None, pattern: re.Pattern[str], what: str) -> str | None:
    if value is None or value == "":
        return None
    if not pattern.match(value):
        raise QueryError(f"invalid {what}")
    return value


def _refuse(live: LearnerEndpoint, reason: str, detail: str = "") -> web.Response:
    verdict = live.loop.intake.reject(reason, detail)
    headers = {"WWW-Authenticate": "Bearer"} if verdict.status == 401 else None
    return web.json_response({"outcome": reason, "detail": detail}, status=verdict.status, headers=headers)


def _authorized(request: web.Request, token: str) -> bool:
    return bearer_matches(request.headers.get("Authorization"), token)


def build_app(live: LearnerEndpoint, token: str) -> web.Application:
    """The aiohttp application of one learner (routes above); `token` guards everything but status."""
    # no body may exceed the largest group this learner could accept (often far below live.max_body_bytes)
    largest = max_message_bytes(live.loop.intake.limits(0))
    max_body = min(live.cfg.live.max_body_bytes, largest or live.cfg.live.max_body_bytes)
    uploads = 0  # rollout bodies being read now (bounded: each one is buffered whole)
    app = web.Application(client_max_size=max_body)
    app[LIVE_KEY] = live
    learner = live.loop

    async def start_notifier(app: web.Application) -> None:
        notifier = Notifier(asyncio.get_running_loop())
        app[NOTIFIER_KEY] = notifier
        live.notify = notifier.notify_threadsafe

    async def weights(request: web.Request) -> web.StreamResponse:
        if not _authorized(request, token):
            return _refuse(live, "unauthorized")
        q = request.query
        try:
            version = _query_int(q.get("version"))
            held_hash = _query_match(q.get("hash"), _HASH, "hash")
            wait = _query_float(q.get("wait"), 0.0, 86_400.0) or 0.0
            sampler = _query_match(q.get("sampler"), _NAME, "sampler name")
            idle = _query_float(q.get("idle"), 0.0, 1.0)
            failed = _query_int(q.get("failed"))
        except QueryError as err:
            return _refuse(live, "malformed", str(err))
        if sampler is not None:
            learner.peers.heard(sampler, version, idle, failed)
        notifier = request.app[NOTIFIER_KEY]
        store = learner.store
        current = version is not None and (version, held_hash) == (store.latest_version, store.latest_hash)
        if current and not live.finished:
            await notifier.wait(min(wait, live.cfg.live.poll_seconds))
        if live.finished:
            if sampler in learner.peers.names:
                live.told_finished.add(sampler)
            return web.json_response({"outcome": "finished"}, status=410)
        if store.latest_version is None:
            return web.json_response({"outcome": "not_ready"}, status=503, headers={"Retry-After": "1"})
        loop = asyncio.get_running_loop()
        update = await loop.run_in_executor(None, store.update_for, version, held_hash)
        if update.kind == "noop":
            return web.Response(status=204, headers={"X-Heterorl-Version": str(update.version)})
        body = encode_update(update)
        learner.traffic.sent(update.version, len(body), learner.full_update_nbytes())
        return web.Response(body=body, content_type="application/octet-stream")

    async def admission(request: web.Request) -> web.StreamResponse:
        if not _authorized(request, token):
            return _refuse(live, "unauthorized")
        q = request.query
        try:
            n = _query_int(q.get("n"))
            version = _query_int(q.get("version"))
            sampler = _query_match(q.get("sampler"), _NAME, "sampler name")
        except QueryError as err:
            return _refuse(live, "malformed", str(err))
        if n is None or version is None or n < 1 or n > live.cfg.learner.groups_per_step:
            return _refuse(live, "malformed", "n (1..groups_per_step) and version are required")
        if sampler is not None:
            learner.peers.heard(sampler, version)
        if live.finished:
            return web.json_response({"outcome": "finished"}, status=410)
        if learner.admit(n, version):
            return web.json_response({"outcome": "granted"})
        retry = min(1.0, live.cfg.live.poll_seconds)
        return web.json_response({"outcome": "wait", "retry_after": retry}, status=429)

    async def rollouts(request: web.Request) -> web.StreamResponse:
        nonlocal uploads
        if not _authorized(request, token):
            return _refuse(live, "unauthorized")
        if request.content_length is not None and request.content_length > max_body:
            return _refuse(live, "too_large", f"{request.content_length} bytes > {max_body}")
        if uploads >= live.cfg.live.max_concurrent_uploads:
            learner.intake.count_busy()
            detail = f"{uploads} uploads under way"
            return web.json_response({"outcome": "busy", "detail": detail}, status=503, headers={"Retry-After": "1"})
        uploads += 1
        try:
            body = await asyncio.wait_for(request.read(), live.cfg.live.body_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            return _refuse(live, "too_large", f"body over {max_body} bytes")
        except asyncio.TimeoutError:
            return _refuse(live, "timeout", f"body not received within {live.cfg.live.body_timeout_s:g} s")
        finally:
            uploads -= 1
        if len(body) > max_body:  # belt and braces: never trust one limit alone
            return _refuse(live, "too_large", f"{len(body)} bytes > {max_body}")
        sampler = request.query.get("sampler")
        if sampler is not None and _NAME.match(sampler):
            learner.peers.heard(sampler)
        if learner.store.latest_version is None:
            return web.json_response({"outcome": "not_ready"}, status=503, headers={"Retry-After": "1"})
        digest = request.headers.get(DIGEST_HEADER)
        verdict = await asyncio.get_running_loop().run_in_executor(None, learner.offer, body, digest)
        if verdict.outcome == "finished" and sampler in learner.peers.names:
            live.told_finished.add(sampler)
        headers = {"Retry-After": "1"} if verdict.status == 503 else None
        payload = {"outcome": verdict.outcome, "group_id": verdict.group_id, "detail": verdict.detail}
        return web.json_response(payload, status=verdict.status, headers=headers)

    async def status(request: web.Request) -> web.StreamResponse:
        return web.json_response(live.status())

    app.on_startup.append(start_notifier)
    app.router.add_get("/v1/weights", weights)
    app.router.add_post("/v1/rollouts", rollouts)
    app.router.add_post("/v1/admission", admission)
    app.router.add_get("/v1/status", status)
    return app


def _url(host: str, port: int) -> str:
    local = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{local}]:{port}" if ":" in local else f"http://{local}:{port}"


async def _linger(live: LearnerEndpoint) -> None:
    """After the last step, answer until every sampler of the run has been told (410), at most `linger_s`. Every
    configured one, not only those heard from lately: after a resume the run may end before a sampler retrying in
    its backoff has reconnected, and it would then retry until `patience_s`."""
    deadline = time.monotonic() + live.cfg.live.linger_s
    while time.monotonic() < deadline:
        if live.loop.peers.names <= live.told_finished:
            return
        await asyncio.sleep(0.05)


def make_runner(live: LearnerEndpoint, token: str) -> GuardedRunner:
    """The application behind the HTTP layer's guard (`guard.py`), counting its refusals like the routes do."""
    cfg = live.cfg.live

    def count(reason: str, detail: str) -> None:
        live.loop.intake.reject(reason, detail)

    guard = Guard(cfg.max_connections, cfg.header_timeout_s, count=count, log=live.events.emit)
    return GuardedRunner(build_app(live, token), guard, access_log=None, handle_signals=False)


async def serve_app(live: LearnerEndpoint, token: str, host: str, port: int, address_file: Path) -> None:
    """Serve until the training loop returns (done or stopped by SIGTERM/SIGINT); the URL goes to `address_file`."""
    runner = make_runner(live, token)
    await runner.setup()
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="train")
    try:
        await web.TCPSite(runner, host, port).start()
        url = _url(host, runner.addresses[0][1])
        tmp = address_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
        tmp.replace(address_file)
        live.events.emit("listening", url=url, version=live.loop.learner.version)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, live.request_stop)
        loop.add_signal_handler(signal.SIGUSR1, live.request_finish)
        await loop.run_in_executor(pool, live.train)
        if live.finished:
            await _linger(live)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            loop.remove_signal_handler(sig)
        live.request_stop()
        pool.shutdown(wait=True)
        await runner.cleanup()
