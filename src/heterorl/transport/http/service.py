"""The learner's HTTP service (aiohttp): the HTTP transport's learner side. Samplers pull weights and exchange
uploads; anyone reads status. It serves the learner process's loop (`live.learner_node`), which runs the training
thread, the signals and the durability; this module only answers requests.

    GET  /v1/weights?version=V&hash=H&wait=S&sampler=NAME&session=ID&idle=X&failed=F    bearer token
         200: a weight-update envelope (envelope.py): the store's smallest correct update from (V, H) -- patch,
              merged patch, or snapshot (+ patch). No V/H: a snapshot.
         204: V/H is the newest version; the request first waits up to min(S, live.poll_seconds) for a newer one
         410: the run is finished;  503: nothing published yet
    POST /v1/exchange                                                bearer token
         body: an upload (`transport.wire`: the sampler's groups, admission totals, reports)
         answer: a reply (`transport.wire`: one verdict per group, admission totals, newest version), with the
         status of the first group not taken (`transport/http/status.py`: 200 when every group was taken, 422 for a
         refused group, 503 for a full queue, 410 finished), or of the refusal of the whole upload (400 malformed,
         401 unauthorized, 403 unknown sampler, 413 too large, 408 timeout, 422 a version never published).
    GET  /v1/status                                                  public: JSON progress and counters

The service speaks plain HTTP; put it behind a TLS-terminating reverse proxy off a trusted network
(docs/deployment.md). CPU work (update merging, upload decoding, journaling) runs in worker threads so the event
loop keeps answering while the training thread computes. The HTTP layer's own limits (connections, header and
idle timeouts, counted parse errors) are in `guard.py`; an upload's body must arrive within
`live.body_timeout_s` (else 408 `timeout`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

from heterorl.config import RunConfig
from heterorl.loop.learner_loop import LearnerLoop
from heterorl.loop.protocol import Reply
from heterorl.rollout_codec import GroupLimits, max_message_bytes
from heterorl.transport.http.auth import bearer_matches
from heterorl.transport.http.guard import Guard, GuardedRunner
from heterorl.transport.http.status import REJECTION_STATUS, status_of, upload_status
from heterorl.transport.wire import MAX_HEADER_BYTES, WireError, decode_upload, encode_reply
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


class EventLog(Protocol):
    def emit(self, event: str, **fields: Any) -> None: ...


_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_SESSION = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
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
    """Refuse a whole request: counted, answered with its status and a reply that says why."""
    live.loop.intake.reject(reason, detail)
    return _reply(Reply(seq=0, refused=reason, detail=detail[:200]), REJECTION_STATUS[reason])


def _reply(reply: Reply, status: int) -> web.Response:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    if status == 503:
        headers["Retry-After"] = str(max(1, math.ceil(reply.retry_after)))
    return web.Response(
        body=encode_reply(reply), status=status, headers=headers, content_type="application/octet-stream"
    )


def _authorized(request: web.Request, token: str) -> bool:
    return bearer_matches(request.headers.get("Authorization"), token)


def max_upload_bytes(cfg: RunConfig, limits: GroupLimits) -> int:
    """The largest upload body a learner reads: its header plus `groups_per_upload` of the largest group it could
    accept, never more than `live.max_body_bytes` (often far below it)."""
    largest = max_message_bytes(limits) or cfg.live.max_body_bytes
    return min(cfg.live.max_body_bytes, MAX_HEADER_BYTES + cfg.cluster.groups_per_upload * largest)


def build_app(live: LearnerEndpoint, token: str) -> web.Application:
    """The aiohttp application of one learner (routes above); `token` guards everything but status."""
    cfg = live.cfg
    max_body = max_upload_bytes(cfg, live.loop.intake.limits(0))
    uploads = 0  # upload bodies being read now (bounded: each one is buffered whole)
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
            session = _query_match(q.get("session"), _SESSION, "session id")
            idle = _query_float(q.get("idle"), 0.0, 1.0)
            failed = _query_int(q.get("failed"))
        except QueryError as err:
            return _refuse(live, "malformed", str(err))
        if sampler is not None:
            learner.heard(sampler, session, version, idle, failed)
        notifier = request.app[NOTIFIER_KEY]
        store = learner.store
        current = version is not None and (version, held_hash) == (store.latest_version, store.latest_hash)
        if current and not live.finished:
            await notifier.wait(min(wait, cfg.live.poll_seconds))
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

    async def exchange(request: web.Request) -> web.StreamResponse:
        nonlocal uploads
        if not _authorized(request, token):
            return _refuse(live, "unauthorized")
        if request.content_length is not None and request.content_length > max_body:
            return _refuse(live, "too_large", f"{request.content_length} bytes > {max_body}")
        if uploads >= cfg.live.max_concurrent_uploads:  # transient: the client sends the same upload again later
            learner.intake.count_busy()
            return web.json_response(
                {"outcome": "busy", "detail": f"{uploads} uploads under way"}, status=503, headers={"Retry-After": "1"}
            )
        uploads += 1
        try:
            body = await asyncio.wait_for(request.read(), cfg.live.body_timeout_s)
        except web.HTTPRequestEntityTooLarge:
            return _refuse(live, "too_large", f"body over {max_body} bytes")
        except asyncio.TimeoutError:
            return _refuse(live, "timeout", f"body not received within {cfg.live.body_timeout_s:g} s")
        finally:
            uploads -= 1
        if len(body) > max_body:  # belt and braces: never trust one limit alone
            return _refuse(live, "too_large", f"{len(body)} bytes > {max_body}")
        if learner.store.latest_version is None:
            return web.json_response({"outcome": "not_ready"}, status=503, headers={"Retry-After": "1"})
        loop = asyncio.get_running_loop()
        try:
            upload = await loop.run_in_executor(None, decode_upload, body, cfg.cluster.groups_per_upload)
        except WireError as err:
            return _refuse(live, "malformed", str(err))
        reply = await loop.run_in_executor(None, learner.exchange, upload)
        if reply.finished and upload.sampler in learner.peers.names:
            live.told_finished.add(upload.sampler)
        if reply.refused:
            return _reply(reply, REJECTION_STATUS.get(reply.refused, 400))
        status = upload_status([v.outcome for v in reply.verdicts])
        return _reply(reply, status_of("finished") if status == 200 and reply.finished else status)

    async def status(request: web.Request) -> web.StreamResponse:
        return web.json_response(live.status())

    app.on_startup.append(start_notifier)
    app.router.add_get("/v1/weights", weights)
    app.router.add_post("/v1/exchange", exchange)
    app.router.add_get("/v1/status", status)
    return app


def _url(host: str, port: int) -> str:
    local = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{local}]:{port}" if ":" in local else f"http://{local}:{port}"


def make_runner(live: LearnerEndpoint, token: str) -> GuardedRunner:
    """The application behind the HTTP layer's guard (`guard.py`), counting its refusals like the routes do."""
    cfg = live.cfg.live

    def count(reason: str, detail: str) -> None:
        live.loop.intake.reject(reason, detail)

    guard = Guard(cfg.max_connections, cfg.header_timeout_s, count=count, log=live.events.emit)
    return GuardedRunner(build_app(live, token), guard, access_log=None, handle_signals=False)


async def start_service(live: LearnerEndpoint, token: str, host: str, port: int) -> tuple[GuardedRunner, str]:
    """Start serving on host:port (0: any free port); returns the runner (await `runner.cleanup()` to stop) and
    the URL samplers connect to."""
    runner = make_runner(live, token)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner, _url(host, runner.addresses[0][1])
