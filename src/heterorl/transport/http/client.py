"""The sampler's side of HTTP: a client of the learner service that only makes outbound requests.

Every request is retried through transient failures (connection refused or reset, no answer in time, 502/503/504/
507) with capped exponential backoff and jitter (`transport.backoff`), sending the same bytes: the conversation is
idempotent (`loop.protocol`). A dead link is noticed without waiting for a long request timeout: a request whose
connection does not open, or that receives nothing, for `Liveness.timeout()` (`live.dead_after_s`, longer on a
link whose round trips are long) is abandoned and retried, and the link is reported down (an event line) until
the next answer. A learner that answers nothing for `live.patience_s` raises `LearnerUnreachableError`.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import aiohttp

from heterorl.config import LiveConfig
from heterorl.console import print_note
from heterorl.eventlog import EventLog
from heterorl.loop.protocol import Reply, Upload
from heterorl.transport.backoff import Backoff, Liveness
from heterorl.transport.base import FINISHED, Held
from heterorl.transport.wire import REPLY_MAGIC, WireError, decode_reply, encode_upload

RETRY_STATUS = frozenset({502, 503, 504, 507})  # 507: the learner's disk is full for now


class LearnerUnreachableError(RuntimeError):
    """The learner did not answer for `live.patience_s` seconds."""


class AuthError(RuntimeError):
    """The learner refused the credential (401) or this sampler (403: revoked, quarantined, unknown): retrying
    cannot help."""


class ProtocolError(RuntimeError):
    """The learner answered something this client does not understand (another program, a version mismatch)."""


class LearnerClient:
    """Requests to one learner service on behalf of one sampler session."""

    def __init__(
        self, url: str, token: str, cfg: LiveConfig, name: str, session: str, rng: random.Random, events: EventLog
    ):
        self.url = url.rstrip("/")
        self.cfg, self.name, self.session, self.events = cfg, name, session, events
        self.backoff = Backoff(cfg.backoff_initial_s, cfg.backoff_max_s, rng)
        self.liveness = Liveness(cfg.dead_after_s)
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session: aiohttp.ClientSession | None = None
        self._weights: aiohttp.ClientSession | None = None
        self.last_contact = time.monotonic()
        self.counts: dict[str, int] = {"retries": 0, "link_down": 0, "link_up": 0}
        self.heard = False  # any answer yet; until then the first failure is also told in words (stderr)

    async def __aenter__(self) -> LearnerClient:
        connector = aiohttp.TCPConnector(limit=16)  # the uploads in flight, status
        self._session = aiohttp.ClientSession(headers=self._headers, connector=connector)
        # The weight pulls keep a connection of their own: its congestion window, grown by one update, carries the
        # next one (pulls follow each other within an RTO, so Linux does not restart slow start). On a pooled
        # connection last used by an upload, whose replies are small, every update started again from the initial
        # window: 4 round trips for a 155 kB patch on a 600 ms link (docs/wan-lab.md).
        weights = aiohttp.TCPConnector(limit=1)
        self._weights = aiohttp.ClientSession(headers=self._headers, connector=weights)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for session in (self._session, self._weights):
            if session is not None:
                await session.close()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        data: bytes | None = None,
        wait_s: float = 0.0,
        weights: bool = False,
    ) -> tuple[int, bytes]:
        """(status, body) of the first answer that is not a transient failure; retries the rest. `weights`: on the
        weight pulls' own connection."""
        session = self._weights if weights else self._session
        assert session is not None, "use `async with LearnerClient(...)`"
        while True:
            live = self.liveness.timeout()
            timeout = aiohttp.ClientTimeout(
                total=self.cfg.request_timeout_s + wait_s, sock_connect=live, sock_read=live + wait_s
            )
            began, error = time.monotonic(), ""
            try:
                async with session.request(
                    method, self.url + path, params=params, data=data, timeout=timeout
                ) as response:
                    body = await response.read()
                    now = time.monotonic()
                    self.last_contact, self.heard = now, True
                    if self.liveness.answered(max(now - began - wait_s, 0.0), now):
                        self.counts["link_up"] += 1
                        self.events.emit("link_up", url=self.url)
                    if response.status == 401:
                        raise AuthError(f"the learner at {self.url} refused this sampler's credential (401)")
                    if response.status not in RETRY_STATUS:
                        self.backoff.reset()
                        return response.status, body
                    error = f"HTTP {response.status}"
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as exc:
                error = f"{type(exc).__name__}: {exc}"
                if self.liveness.timed_out():
                    self.counts["link_down"] += 1
                    self.events.emit("link_down", url=self.url, error=error[:200])
            if time.monotonic() - self.last_contact > self.cfg.patience_s:
                raise LearnerUnreachableError(f"no answer from {self.url} for {self.cfg.patience_s:.0f} s ({error})")
            if not self.heard and not self.counts["retries"]:  # a wrong URL, or a learner not started yet
                print_note(
                    f"no answer from {self.url} yet ({error[:120]}); retrying for up to {self.cfg.patience_s:.0f} s "
                    "(live.patience_s)"
                )
            delay = self.backoff.next_delay()
            self.counts["retries"] += 1
            self.events.emit("retry", path=path, error=error[:200], delay=round(delay, 3))
            await asyncio.sleep(delay)

    async def status(self) -> dict[str, Any]:
        status, body = await self._request("GET", "/v1/status")
        try:
            answer = json.loads(body) if status == 200 else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            answer = None
        if not isinstance(answer, dict) or "target_steps" not in answer:
            raise ProtocolError(f"{self.url} is not a heterorl learner (GET /v1/status answered {status})")
        return answer

    async def pull(self, held: Held, wait_s: float, idle: float | None, failed: int) -> bytes | str | None:
        """A weight-update envelope, None when already current, or FINISHED. The sampler reports its idle share
        and how many updates it failed to apply (the learner's metrics show them)."""
        version, state_hash = held
        params = {"sampler": self.name, "session": self.session, "wait": f"{wait_s:g}", "failed": str(failed)}
        if version is not None and state_hash is not None:
            params.update(version=str(version), hash=state_hash)
        if idle is not None:
            params["idle"] = f"{min(max(idle, 0.0), 1.0):.4f}"
        status, body = await self._request("GET", "/v1/weights", params=params, wait_s=wait_s, weights=True)
        if status == 200:
            return body
        if status == 204:
            return None
        if status == 410:
            return FINISHED
        if status == 403 and body.startswith(REPLY_MAGIC):
            try:
                reply = decode_reply(body, 0)
            except WireError:
                reply = None
            if reply is not None and reply.refused:
                raise AuthError(f"the learner at {self.url} refused this sampler as {reply.refused!r}: {reply.detail}")
        raise ProtocolError(f"GET {self.url}/v1/weights answered {status}: {body[:200]!r}")

    async def exchange(self, upload: Upload) -> Reply:
        """POST one upload; the learner's reply (whatever its status: a refused group is a 4xx with a reply)."""
        status, body = await self._request("POST", "/v1/exchange", data=encode_upload(upload))
        if body.startswith(REPLY_MAGIC):
            try:
                return decode_reply(body, len(upload.groups))
            except WireError as err:
                raise ProtocolError(f"POST {self.url}/v1/exchange answered an unreadable reply: {err}") from None
        raise ProtocolError(f"POST {self.url}/v1/exchange answered {status}: {body[:200]!r}")
