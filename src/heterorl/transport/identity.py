"""Sampler identities: one credential per sampler, bound to its name, in a file the learner reloads when it changes.

The credentials file (`trust.credentials`, YAML or JSON) maps each sampler name to its credential:

    samplers:
      s0: {token_sha256: 9f86d0...}          # a bearer token, stored as its SHA-256 (hex)
      s1: {public_key: 3b6a27bc...}          # an Ed25519 public key (64 hex digits): the sampler signs requests
      s2: {token_sha256: 60303a..., revoked: true}

Tokens are 256-bit random strings (`new_token`), so a plain SHA-256 is enough at rest (no password stretching is
needed to resist guessing), and a leaked file does not let anyone act as a sampler. Comparisons are constant-time
(`hmac.compare_digest`). A store transport has no bearer: there the sampler signs every upload with its own
Ed25519 key (`sign_upload`: the object is `SIGNED_UPLOAD` | signature | upload, the signature over its sampler name,
session, seq and the BLAKE2b-256 of the upload), and the learner checks it with the key in the file (`open_upload`),
so whoever can write the store cannot upload as a sampler, nor under another sampler's prefix. The other way,
a learner with a key (`trust.learner_private_key`) signs each reply object over the upload's sampler, session and
seq (`sign_reply`), and a sampler holding its public key reads nothing else (`open_reply`): whoever can write the
store cannot answer an upload in the learner's place.

Revoking a sampler -- `revoked: true`, or removing its entry -- refuses it from the next request on, without a
restart and without touching the others: every check first looks at the file's (inode, size, mtime) and reloads
it when it changed; `request_reload` (the learner's SIGHUP handler) forces a reload. A file that
does not parse keeps the previous credentials in force (a typo must not lock every sampler out), counts the
failure, says why in `last_error`, and is read again as soon as it changes.

Verdicts use the intake's reason names: `unknown_sampler` (no such name), `revoked`, `unauthorized` (a missing or
wrong credential).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from heterorl.errors import SetupError

SIGNED_UPLOAD = b"HRLSUP01"
UPLOAD_DOMAIN = b"heterorl/upload/v1\x00"
SIGNED_REPLY = b"HRLSRE01"
REPLY_DOMAIN = b"heterorl/reply/v1\x00"
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")  # cluster.samplers' names
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
MAX_FILE_BYTES = 4 * 2**20


class CredentialsError(SetupError, ValueError):
    """A credentials file that cannot be used; the message names the entry at fault."""


@dataclass(frozen=True)
class Credential:
    """One sampler's credential: a token's SHA-256 or an Ed25519 public key (raw, 32 bytes)."""

    token_sha256: bytes | None = None
    public_key: bytes | None = None
    revoked: bool = False


@dataclass(frozen=True)
class AuthResult:
    """A check's verdict: `reason` is "" when `ok`, else unknown_sampler | revoked | unauthorized."""

    ok: bool
    name: str | None = None
    reason: str = ""


def hash_token(token: str) -> str:
    """A token's SHA-256, hex: what the credentials file stores."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh 256-bit sampler token (URL-safe text)."""
    return secrets.token_urlsafe(32)


def parse_credentials(raw: Any, where: str) -> dict[str, Credential]:
    """Validate a parsed credentials file into name -> Credential (CredentialsError says which entry is wrong)."""
    if not isinstance(raw, dict) or set(raw) != {"samplers"} or not isinstance(raw["samplers"], dict):
        raise CredentialsError(f"{where}: expected a mapping with one key, samplers: {{name: credential}}")
    out = {}
    for name, entry in raw["samplers"].items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise CredentialsError(f"{where}: sampler name {str(name)[:40]!r} is not a cluster.samplers name")
        if not isinstance(entry, dict) or not set(entry) <= {"token_sha256", "public_key", "revoked"}:
            raise CredentialsError(f"{where}: {name}: expected token_sha256 and/or public_key, and revoked")
        token, key, revoked = entry.get("token_sha256"), entry.get("public_key"), entry.get("revoked", False)
        for field, value in (("token_sha256", token), ("public_key", key)):
            if value is not None and (not isinstance(value, str) or not _HEX64.match(value)):
                raise CredentialsError(f"{where}: {name}.{field} must be 64 lower-case hex digits")
        if token is None and key is None:
            raise CredentialsError(f"{where}: {name} has no credential (token_sha256 or public_key)")
        if not isinstance(revoked, bool):
            raise CredentialsError(f"{where}: {name}.revoked must be true or false")
        out[name] = Credential(
            token_sha256=None if token is None else bytes.fromhex(token),
            public_key=None if key is None else bytes.fromhex(key),
            revoked=revoked,
        )
    return out


def _read(path: Path) -> dict[str, Credential]:
    data = path.read_bytes()
    if len(data) > MAX_FILE_BYTES:
        raise CredentialsError(f"{path}: {len(data)} bytes, over {MAX_FILE_BYTES}")
    try:
        raw = yaml.safe_load(data.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as err:
        raise CredentialsError(f"{path}: not YAML/JSON ({str(err)[:200]})") from None
    return parse_credentials(raw, str(path))


class CredentialRegistry:
    """The learner's view of the credentials file; safe to call from every request thread."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int] | None = None  # (inode, size, mtime_ns) of the last read attempt
        self._force = False
        self.reloads = 0  # successful reads after the first
        self.failed_reloads = 0
        self.last_error: str | None = None
        self._credentials = self._load_first()

    def _stat(self) -> tuple[int, int, int]:
        st = self.path.stat()
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _load_first(self) -> dict[str, Credential]:
        if not self.path.is_file():
            raise CredentialsError(f"trust.credentials: {self.path} is not a file")
        self._seen = self._stat()
        return _read(self.path)

    # ---------------------------------------------------------------- reloading
    def request_reload(self) -> None:
        """Read the file again at the next check (a signal handler may call this: it only sets a flag)."""
        self._force = True

    def refresh(self) -> None:
        """Reload the file if it changed since it was last read (or a reload was requested)."""
        try:
            seen = self._stat()
        except OSError as err:  # moved away mid-edit: keep what is in force, say why
            with self._lock:
                self.last_error = f"{self.path}: {err.strerror}"
            return
        with self._lock:
            if seen == self._seen and not self._force:
                return
            self._seen, self._force = seen, False
            try:
                fresh = _read(self.path)
            except (CredentialsError, OSError) as err:
                self.failed_reloads += 1
                self.last_error = str(err)
                return
            self._credentials = fresh
            self.reloads += 1
            self.last_error = None

    def credential(self, name: str) -> Credential | None:
        self.refresh()
        with self._lock:
            return self._credentials.get(name)

    @property
    def names(self) -> list[str]:
        self.refresh()
        with self._lock:
            return sorted(self._credentials)

    # ---------------------------------------------------------------- checks
    def _known(self, name: str) -> tuple[Credential | None, AuthResult | None]:
        cred = self.credential(name)
        if cred is None:
            return None, AuthResult(False, name, "unknown_sampler")
        if cred.revoked:
            return None, AuthResult(False, name, "revoked")
        return cred, None

    def check_token(self, name: str, token: str | None) -> AuthResult:
        """Is `token` the credential of sampler `name`?"""
        cred, refused = self._known(name)
        if cred is None:
            assert refused is not None
            return refused
        given = hashlib.sha256((token or "").encode()).digest()
        if cred.token_sha256 is None or token is None or not hmac.compare_digest(given, cred.token_sha256):
            return AuthResult(False, name, "unauthorized")
        return AuthResult(True, name)

    def identify(self, token: str | None) -> AuthResult:
        """The sampler whose token this is (a request then acts as that sampler, whatever name it claims)."""
        self.refresh()
        given = hashlib.sha256((token or "").encode()).digest()
        with self._lock:
            entries = list(self._credentials.items())
        found = None
        for name, cred in entries:  # every entry compared in constant time: the time says nothing of the token
            if cred.token_sha256 is not None and hmac.compare_digest(given, cred.token_sha256) and token:
                found = (name, cred)
        if found is None:
            return AuthResult(False, None, "unauthorized")
        name, cred = found
        return AuthResult(False, name, "revoked") if cred.revoked else AuthResult(True, name)

    def check_signature(self, name: str, message: bytes, signature_hex: str | None) -> AuthResult:
        """Did sampler `name` sign `message` (Ed25519, hex signature) with its registered key?"""
        cred, refused = self._known(name)
        if cred is None:
            assert refused is not None
            return refused
        if cred.public_key is None or signature_hex is None or not re.fullmatch(r"[0-9a-f]{128}", signature_hex):
            return AuthResult(False, name, "unauthorized")
        try:
            Ed25519PublicKey.from_public_bytes(cred.public_key).verify(bytes.fromhex(signature_hex), message)
        except (InvalidSignature, ValueError):
            return AuthResult(False, name, "unauthorized")
        return AuthResult(True, name)

    def open_upload(self, sampler: str, session: str, seq: int, data: bytes) -> tuple[AuthResult, bytes]:
        """(verdict, the upload's bytes) of a store object under sampler/session/seq: it must be signed by that
        sampler's registered key (`sign_upload`); else unknown_sampler, revoked, or unauthorized (unsigned, another
        key, another sampler's name)."""
        n = len(SIGNED_UPLOAD) + 64
        if len(data) < n or not data.startswith(SIGNED_UPLOAD):
            _, refused = self._known(sampler)
            return (refused or AuthResult(False, sampler, "unauthorized")), b""
        upload, signature = data[n:], data[len(SIGNED_UPLOAD) : n].hex()
        return self.check_signature(sampler, upload_statement(sampler, session, seq, upload), signature), upload


def _statement(domain: bytes, sampler: str, session: str, seq: int, body: bytes) -> bytes:
    head = f"{sampler}\x00{session}\x00{seq}\x00".encode()
    return domain + head + hashlib.blake2b(body, digest_size=32).digest()


def upload_statement(sampler: str, session: str, seq: int, upload: bytes) -> bytes:
    """What a sampler signs for one store upload: its name, session, seq and the upload's BLAKE2b-256."""
    return _statement(UPLOAD_DOMAIN, sampler, session, seq, upload)


def sign_upload(key: Ed25519PrivateKey, sampler: str, session: str, seq: int, upload: bytes) -> bytes:
    """The store object of a signed upload (`SIGNED_UPLOAD` | 64-byte signature | upload)."""
    return SIGNED_UPLOAD + key.sign(upload_statement(sampler, session, seq, upload)) + upload


def sign_reply(key: Ed25519PrivateKey, sampler: str, session: str, seq: int, reply: bytes) -> bytes:
    """The store object of the learner's signed reply to one upload (`SIGNED_REPLY` | 64-byte signature | reply),
    signed with the learner's key (`trust.learner_private_key`) over the upload's sampler, session and seq."""
    return SIGNED_REPLY + key.sign(_statement(REPLY_DOMAIN, sampler, session, seq, reply)) + reply


def open_reply(learner: Ed25519PublicKey | None, sampler: str, session: str, seq: int, data: bytes) -> bytes | None:
    """A reply object's bytes; None when `learner` (its public key) is given and the object is not signed with it
    for this very upload (unsigned, another key, another upload's reply). Without a key a signature is taken off
    unchecked, so a sampler that was not given the key still reads a signing learner's replies."""
    n = len(SIGNED_REPLY) + 64
    signed = len(data) >= n and data.startswith(SIGNED_REPLY)
    body = data[n:] if signed else data
    if learner is None:
        return body
    if not signed:
        return None
    try:
        learner.verify(data[len(SIGNED_REPLY) : n], _statement(REPLY_DOMAIN, sampler, session, seq, body))
    except InvalidSignature:
        return None
    return body


# ---------------------------------------------------------------- editing the file (the `heterorl keys` commands)
def _load_raw(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"samplers": {}}
    raw = yaml.safe_load(path.read_text()) or {"samplers": {}}
    parse_credentials(raw, str(path))  # refuse to edit a file that is already wrong
    return raw


def _write_atomic(path: Path, raw: dict[str, Any]) -> None:
    """Write to a temporary file beside `path`, then rename over it: a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def add_sampler(path: str | Path, name: str, *, key: Ed25519PrivateKey | None = None) -> str | None:
    """Give sampler `name` a new credential in the file (replacing any it had): a fresh token, returned (it is
    shown once and stored only hashed), or the public half of `key`."""
    if not _NAME.match(name):
        raise CredentialsError(f"{name!r} is not a cluster.samplers name (A-Z a-z 0-9 . _ -)")
    p = Path(path)
    raw = _load_raw(p)
    if key is not None:
        raw["samplers"][name] = {"public_key": key.public_key().public_bytes_raw().hex()}
        token = None
    else:
        token = new_token()
        raw["samplers"][name] = {"token_sha256": hash_token(token)}
    _write_atomic(p, raw)
    return token


def revoke_sampler(path: str | Path, name: str) -> None:
    """Mark sampler `name` revoked (a running learner refuses it from its next request on)."""
    p = Path(path)
    raw = _load_raw(p)
    if name not in raw["samplers"]:
        raise CredentialsError(f"{p}: no sampler {name!r} to revoke")
    raw["samplers"][name]["revoked"] = True
    _write_atomic(p, raw)
