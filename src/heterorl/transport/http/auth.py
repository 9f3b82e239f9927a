"""Who may call the learner's service: where a bearer token comes from, and how a request's token is checked.

Without `trust.credentials`, one token authorises any sampler to pull weights and push rollouts (under any name).
With it, every sampler has its own token, bound to its name (`transport/identity.py`): the token says which
sampler a request comes from, a request may act only as that sampler, and a revoked token is refused (403
`revoked`) from its next request on. `Gate` is the one check the service makes, whichever the setup.

A token It is read from `live.token_file` when set,
else from the environment variable `live.token_env`; a learner started without one generates it
(`secrets.token_urlsafe`) and prints it once, a sampler without one refuses to start. Tokens are compared in
constant time (`hmac.compare_digest`) so response timing does not leak a prefix.
"""

from __future__ import annotations

import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from heterorl.config import LiveConfig
from heterorl.transport.identity import AuthResult, CredentialRegistry

MIN_TOKEN_CHARS = 16  # a shorter secret is guessable; refuse it rather than run with it


class TokenError(RuntimeError):
    """No usable token was configured."""


def configured_token(cfg: LiveConfig) -> str | None:
    """The token from `token_file` (if set) or the `token_env` variable; None when neither holds one."""
    if cfg.token_file is not None:
        path = Path(cfg.token_file).expanduser()
        if not path.is_file():
            raise TokenError(f"live.token_file {str(path)!r} does not exist")
        token = path.read_text(encoding="utf-8").strip()
        if not token:
            raise TokenError(f"live.token_file {str(path)!r} is empty")
    else:
        token = os.environ.get(cfg.token_env, "").strip()
        if not token:
            return None
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenError(f"the token must have at least {MIN_TOKEN_CHARS} characters")
    return token


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def bearer_value(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None when there is none (or it is not UTF-8)."""
    if header is None:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    try:  # header bytes that are not UTF-8 arrive as surrogates, which cannot be a (UTF-8) token
        value.strip().encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value.strip()


def bearer_matches(header: str | None, token: str) -> bool:
    """True when an `Authorization` header carries exactly `Bearer <token>` (constant-time comparison)."""
    given = bearer_value(header)
    return given is not None and hmac.compare_digest(given.encode("utf-8"), token.encode("utf-8"))


@dataclass(frozen=True)
class Gate:
    """The service's check of a request's credential: the run's one token (`token`: the request may act as any
    sampler, `name` None), or per-sampler tokens (`credentials`: the token names its sampler)."""

    token: str | None = None
    credentials: CredentialRegistry | None = None

    def check(self, header: str | None) -> AuthResult:
        """ok with the sampler's name (None: any), or refused as unauthorized | revoked."""
        if self.credentials is not None:
            return self.credentials.identify(bearer_value(header))
        if self.token is not None and bearer_matches(header, self.token):
            return AuthResult(True)
        return AuthResult(False, reason="unauthorized")

    @staticmethod
    def acts_as(who: AuthResult, name: str | None) -> str | None:
        """Why a request authenticated as `who` may not act as sampler `name` (None: it may)."""
        if who.name is None or name is None or name == who.name:
            return None
        return f"the credential of {who.name!r} cannot act as {name[:64]!r}"
