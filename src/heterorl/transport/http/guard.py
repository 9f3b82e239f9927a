"""The HTTP layer's own defences: connection cap, header/idle timeout, and counted, one-line parse errors.

aiohttp answers a request it cannot parse (bad Content-Length or chunk size, Transfer-Encoding with
Content-Length, an over-long request line or header) with a 400 before any route sees it, logs a traceback, and
keeps no count; it has no limit on open connections and, by default, lets a silent or 1-byte-per-second client
hold a connection for an hour. `GuardedRunner` serves the same application with a request handler that

- refuses a connection over `max_connections` at once (a 503 line, then close), counted `too_many_connections`;
- closes a connection that has not sent a complete request head within `header_timeout_s` (aiohttp's
  keep-alive timer, which also closes idle keep-alive connections), counting it `timeout` when it had started one;
- answers every error aiohttp itself raises with JSON `{"outcome", "detail"}` and the same status, counted
  (`bad_http` for 400, `timeout` for 504, `internal_error` for a handler bug), logged as one event line.

Counting goes through `count(reason, detail)` (the learner's intake counters), so `/v1/status` and the metrics
show the HTTP layer's rejections next to the application's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

ERROR_REASONS = {400: "bad_http", 408: "timeout", 413: "too_large", 504: "timeout"}
_REFUSE_CONNECTION = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b'Connection: close\r\nContent-Length: 35\r\n\r\n{"outcome": "too_many_connections"}'
)


@dataclass
class Guard:
    """Limits of the HTTP layer and where its refusals are counted and logged."""

    max_connections: int
    header_timeout_s: float
    count: Callable[[str, str], None]  # (reason, detail): counted like every other rejection
    log: Callable[..., None]  # an event line (EventLog.emit)
    open_connections: int = 0


class GuardedHandler(RequestHandler):
    """aiohttp's request handler (one per connection) with the guard's connection cap, header deadline and
    counted error responses."""

    def __init__(self, manager: web.Server, *, guard: Guard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.guard = guard
        self.admitted = False
        self.requests_started = 0
        self.bytes_before_request = 0
        self.opened_at = 0.0
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self.guard
        if guard.open_connections >= guard.max_connections:
            guard.count("too_many_connections", f"{guard.open_connections} connections open")
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(_REFUSE_CONNECTION)
            transport.close()
            return
        self.admitted = True
        guard.open_connections += 1
        super().connection_made(transport)
        loop = asyncio.get_running_loop()
        self.opened_at = loop.time()
        self.deadline = loop.call_later(guard.header_timeout_s, self._header_deadline)

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        if self.requests_started == 0:
            self.bytes_before_request += len(data)
        super().data_received(data)

    def request_started(self) -> None:
        """The head of a request is complete (the server's request factory calls this)."""
        self.requests_started += 1
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None

    def _header_deadline(self) -> None:
        """No complete request head within `header_timeout_s` of connecting: slow or silent, close it. (aiohttp's
        keep-alive timer, set to the same timeout, does so too in recent versions and closes idle connections
        between requests.)"""
        self.deadline = None
        if self.requests_started == 0:
            self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.admitted:
            return
        self.admitted = False
        guard = self.guard
        guard.open_connections -= 1
        if self.deadline is not None:
            self.deadline.cancel()
        waited = asyncio.get_running_loop().time() - self.opened_at
        if self.requests_started == 0 and self.bytes_before_request and waited >= guard.header_timeout_s - 0.01:
            guard.count("timeout", f"no complete request head in {guard.header_timeout_s:g} s")  # slow loris
        super().connection_lost(exc)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's own errors (unparsable requests, a handler that timed out or raised): a JSON answer with the
        reason, counted, one event line (no traceback: a peer could fill the log with them)."""
        if request.writer.output_size > 0:  # a response was under way: nothing can be answered any more
            return super().handle_error(request, status, exc, message)
        reason = ERROR_REASONS.get(status, "internal_error")
        detail = (message or (f"{type(exc).__name__}: {exc}" if exc is not None else ""))[:300]
        self.guard.count(reason, detail)
        self.guard.log("http_error", status=status, reason=reason, detail=detail)
        response = web.json_response({"outcome": reason, "detail": detail}, status=status)
        response.force_close()
        return response


class GuardedServer(web.Server):
    """An aiohttp low-level server whose connections are `GuardedHandler`s."""

    def __init__(self, handler: Any, *, guard: Guard, **kwargs: Any) -> None:
        factory = kwargs.pop("request_factory")

        def request_factory(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
            if isinstance(protocol, GuardedHandler):
                protocol.request_started()
            return factory(message, payload, protocol, writer, task)

        super().__init__(handler, request_factory=request_factory, **kwargs)
        self.guard = guard

    def __call__(self) -> GuardedHandler:
        return GuardedHandler(self, loop=self._loop, guard=self.guard, **self._kwargs)


class GuardedRunner(web.AppRunner):
    """`web.AppRunner` serving the application through a `GuardedServer` (same routes, same kwargs)."""

    def __init__(self, app: web.Application, guard: Guard, *, handle_signals: bool = False, **kwargs: Any) -> None:
        super().__init__(app, handle_signals=handle_signals, **kwargs)
        self.guard = guard
        self.server_kwargs = kwargs  # the request handler's (the runner's own are named above)

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()  # starts the application (on_startup) and freezes it
        return GuardedServer(
            plain.request_handler,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            guard=self.guard,
            keepalive_timeout=self.guard.header_timeout_s,
            **self.server_kwargs,
        )
