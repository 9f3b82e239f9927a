"""The live cluster's shared secret: where the bearer token comes from, and how a request's token is checked.

One token authorises a sampler to pull weights and push rollouts. It is read from `live.token_file` when set,
else from the environment variable `live.token_env`; a learner started without one generates it
(`secrets.token_urlsafe`) and prints it once, a sampler without one refuses to start. Tokens are compared in
constant time (`hmac.compare_digest`) so response timing does not leak a prefix.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from heterorl.config import LiveConfig

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


def bearer_matches(header: str | None, token: str) -> bool:
    """True when an `Authorization` header carries exactly `Bearer <token>` (constant-time comparison)."""
    if header is None:
        return False
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    try:  # header bytes that are not UTF-8 arrive as surrogates, which cannot be the (UTF-8) token
        given = value.strip().encode("utf-8")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(given, token.encode("utf-8"))
