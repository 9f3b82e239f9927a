"""The sampler's side of the wire: an HTTP client of the learner service, retries, and link emulation.

`LearnerClient` makes only outbound requests. Connection failures, timeouts and 502/503/504/507 answers are retried
with capped exponential backoff and equal jitter (delay = b/2 + U(0, b/2), b = min(cap, initial * 2^k)) from a
seeded generator, so samplers that lost the learner together do not reconnect in lockstep; a request that keeps
failing for `live.patience_s` raises `LearnerUnreachableError`. A retried POST sends the same bytes: if the first
attempt did arrive, the learner answers "duplicate" and queues nothing twice.

"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import aiohttp

from heterorl.config import LiveConfig
from heterorl.eventlog import EventLog

RETRY_STATUS = frozenset({502, 503, 504, 507})  # 507: the learner's disk is full for now
DIGEST_HEADER = "X-Heterorl-Digest"
FINISHED = "finished"
FINISHED_WAIT = -1.0  # `admit`'s answer once the run is finished


class LearnerUnreachableError(RuntimeError):
    """The learner did not answer for `live.patience_s` seconds."""


class AuthError(RuntimeError):
    """The learner refused the token (401): retrying cannot help."""


class ProtocolError(RuntimeError):
    """The learner answered something this client does not understand (a version mismatch or a bug)."""


class Backoff:
    """Capped exponential backoff with equal jitter."""

    def __init__(self, initial_s: float, cap_s: float, rng: random.Random) -> None:
        self.initial_s, self.cap_s, self.rng = initial_s, cap_s, rng
        self.failures = 0

    def next_delay(self) -> float:
        base = min(self.cap_s, self.initial_s * 2.0**self.failures)
        self.failures += 1
        return base / 2.0 + self.rng.uniform(0.0, base / 2.0)

    def reset(self) -> None:
        self.failures = 0


class LearnerClient:
    """Requests to one learner service on behalf of one sampler."""

    def __init__(self, url: str, token: str, cfg: LiveConfig, name: str, rng: random.Random, events: EventLog):
        self.url = url.rstrip("/")
        self.cfg, self.name, self.events = cfg, name, events
        self.backoff = Backoff(cfg.backoff_initial_s, cfg.backoff_max_s, rng)
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session: aiohttp.ClientSession | None = None
        self.last_contact = time.monotonic()

    async def __aenter__(self) -> LearnerClient:
        self._session = aiohttp.ClientSession(headers=self._headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        wait_s: float = 0.0,
    ) -> tuple[int, bytes]:
        """(status, body) of the first answer that is not a transient failure; retries the rest."""
        assert self._session is not None, "use `async with LearnerClient(...)`"
        timeout = aiohttp.ClientTimeout(total=self.cfg.request_timeout_s + wait_s)
        while True:
            error = ""
            try:
                async with self._session.request(
                    method, self.url + path, params=params, data=data, headers=headers, timeout=timeout
                ) as response:
                    body = await response.read()
                    self.last_contact = time.monotonic()
                    if response.status == 401:
                        raise AuthError(f"the learner at {self.url} refused the token (401)")
                    if response.status not in RETRY_STATUS:
                        self.backoff.reset()
                        return response.status, body
                    error = f"HTTP {response.status}"
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            if time.monotonic() - self.last_contact > self.cfg.patience_s:
                raise LearnerUnreachableError(f"no answer from {self.url} for {self.cfg.patience_s:.0f} s ({error})")
            delay = self.backoff.next_delay()
            self.events.emit("retry", path=path, error=error[:200], delay=round(delay, 3))
            await asyncio.sleep(delay)

    async def status(self) -> dict[str, Any]:
        status, body = await self._request("GET", "/v1/status")
        try:
            answer = json.loads(body) if status == 200 else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            answer = None
        if not isinstance(answer, dict):  # another web server, or a wrong path on the learner's
            raise ProtocolError(f"GET {self.url}/v1/status answered HTTP {status}, not a heterorl learner's status")
        return answer

    async def pull(
        self, version: int | None, state_hash: str | None, wait_s: float, idle: float | None, failed: int = 0
    ) -> bytes | str | None:
        """A weight-update envelope, None when already current, or FINISHED. The sampler reports its idle share
        and how many updates it failed to apply (the learner's metrics show them)."""
        params = {"sampler": self.name, "wait": f"{wait_s:g}", "failed": str(failed)}
        if version is not None and state_hash is not None:
            params.update(version=str(version), hash=state_hash)
        if idle is not None:
            params["idle"] = f"{min(max(idle, 0.0), 1.0):.4f}"
        status, body = await self._request("GET", "/v1/weights", params=params, wait_s=wait_s)
        if status == 200:
            return body
        if status == 204:
            return None
        if status == 410:
            return FINISHED
        raise ProtocolError(f"GET /v1/weights answered {status}: {body[:200]!r}")

    async def admit(self, n: int, version: int) -> float | None:
        """Ask to start generating n groups with weights of `version` (AReaL's admission rule): None when granted,
        else the seconds to wait before asking again (the learner's Retry-After)."""
        params = {"sampler": self.name, "n": str(n), "version": str(version)}
        status, body = await self._request("POST", "/v1/admission", params=params)
        if status == 200:
            return None
        if status == 410:
            return FINISHED_WAIT
        if status == 429:
            try:
                wait = float(json.loads(body)["retry_after"])
            except (ValueError, KeyError, TypeError, UnicodeDecodeError):
                wait = self.cfg.backoff_initial_s
            return min(max(wait, 0.01), self.cfg.backoff_max_s)
        raise ProtocolError(f"POST /v1/admission answered {status}: {body[:200]!r}")

    async def push(self, payload: bytes, digest: str) -> str:
        """POST one encoded group (with the digest of the bytes as generated): "accepted", "duplicate", FINISHED,
        or the learner's rejection reason."""
        status, body = await self._request(
            "POST", "/v1/rollouts", params={"sampler": self.name}, data=payload, headers={DIGEST_HEADER: digest}
        )
        if status == 410:
            return FINISHED
        try:
            outcome = json.loads(body).get("outcome")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            outcome = None
        return outcome if isinstance(outcome, str) else f"http_{status}"
