"""Objects under one URL prefix: put (atomic), get (bounded), list, delete -- in a directory, in S3, or in memory.

`FsspecStore` serves `file://` (a shared or network file system: HeteroRL's set-up; through localfs.py) and `s3://`
(AWS S3, Cloudflare R2, MinIO, GCS's S3 API, via fsspec's s3fs); `MemoryStore` is the same interface in a dict, for
the simulator and tests. Every store operation ends in one of four ways: it worked; `ObjectMissing` (no such object;
its subclass `ObjectNotRegular`: something that is not a regular file is where the object belongs, refused without
reading it); `StoreUnavailable` (the store did not answer or failed: retry with backoff; its subclass
`ObjectTimeout` names the one object whose call made no progress, while other calls may still work);
`StoreSetupError` (a mistake only a person can fix: no credentials, access denied, no bucket -- one line that says
what to do).

Atomic puts: an S3 PUT becomes visible whole or not at all; on a file system the bytes go to a hidden temporary
name in the same directory and are renamed into place (rename is atomic on POSIX file systems and NFS), and
listings skip the temporary names. A reader therefore never sees half an object written by heterorl.

Hostile or broken file systems (`file://`, see localfs.py): a listing holds regular files only and reports every
other entry it met (a FIFO, socket, device, symlink -- a loop or one out of the root -- an unreadable folder) in
`Listing.skipped` with its kind, without opening it; `get` refuses such an entry with `ObjectNotRegular` (its
`kind`), reads at most max_bytes + 1 bytes, and raises `ObjectTimeout` when the file system shows no progress for
`transport.store.timeout_s`; no symlink below the root is followed, so nothing outside the root is read or written.
On S3 there are no such entries; reads are bounded by a Range request, and botocore's connect and read timeouts
(`timeout_s`, per socket read) bound every call.
"""

from __future__ import annotations

import email.utils
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

from heterorl.config import StoreConfig
from heterorl.transport.store import localfs
from heterorl.transport.store.localfs import KINDS, TMP_PREFIX

T = TypeVar("T")
CONTINUE_MIN_BYTES = 2 << 20  # PUTs smaller than this send their body at once (`_no_continue_for_small_puts`)


class StoreUnavailable(OSError):  # noqa: N818 (reads as a state: "the store is unavailable")
    """The store did not answer, or failed (outage, timeout, 5xx): retry later."""


class BucketMissing(StoreUnavailable):
    """The bucket itself is not there (deleted, or a typo in the URL)."""


class ObjectMissing(LookupError):  # noqa: N818
    """No object under that key (never written, deleted by retention, or lost)."""


class ObjectNotRegular(ObjectMissing):
    """Where the object belongs there is no regular file heterorl may read: `kind` is one of KINDS ('symlink',
    'fifo', 'socket', 'char_device', 'block_device', 'directory', 'other', 'unreadable'). Nothing was read; a
    caller that only handles ObjectMissing treats it as absent, one that counts refusals catches it first."""

    def __init__(self, key: str, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.key, self.kind = key, kind


class ObjectTimeout(StoreUnavailable):
    """One object's read or write showed no progress for `timeout_s` (a hung or very slow file system)."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(detail)
        self.key = key


class StoreSetupError(RuntimeError):
    """The store cannot be used as configured; the message says why and what to do."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the store's root, '/'-separated
    size: int


@dataclass(frozen=True)
class Skipped:
    """An entry a listing met that is not an object, and was not opened."""

    key: str
    kind: str  # one of localfs.KINDS

    def __post_init__(self) -> None:
        assert self.kind in KINDS, f"unknown kind {self.kind!r}"


class Listing(list[ObjectInfo]):
    """The objects (regular files, sorted by key), and in `skipped` every other entry met, with its kind."""

    def __init__(self, objects: list[ObjectInfo], skipped: list[Skipped] | None = None) -> None:
        super().__init__(objects)
        self.skipped: list[Skipped] = skipped or []


class ObjectStore(ABC):
    """Keys are '/'-separated paths below the store's root URL."""

    url: str

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write `data` under `key` atomically (readers see all of it or nothing); replaces an existing object."""

    @abstractmethod
    def get(self, key: str, max_bytes: int) -> bytes:
        """The object's bytes; at most max_bytes + 1 are read (a longer result means "too large")."""

    @abstractmethod
    def list(self, prefix: str) -> Listing:
        """Every object whose key starts with `prefix` (a folder, ending in '/'), sorted by key; `.skipped`: the
        entries there that are not objects (a FIFO, a symlink...), for the caller to count (never opened)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; a missing one is fine."""

    def delete_many(self, keys: list[str]) -> None:
        """Remove these objects (missing ones are fine); a store with a batch call makes it one request."""
        for key in keys:
            self.delete(key)


class MemoryStore(ObjectStore):
    """A dict behind the store interface (thread-safe); `fail` makes every call raise StoreUnavailable (outages)."""

    def __init__(self, url: str = "memory://store") -> None:
        self.url = url
        self.objects: dict[str, bytes] = {}
        self.fail = False
        self._lock = threading.Lock()

    def _check(self) -> None:
        if self.fail:
            raise StoreUnavailable(f"{self.url} is unavailable")

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self._check()
            self.objects[key] = bytes(data)

    def get(self, key: str, max_bytes: int) -> bytes:
        with self._lock:
            self._check()
            if key not in self.objects:
                raise ObjectMissing(key)
            return self.objects[key][: max_bytes + 1]

    def list(self, prefix: str) -> Listing:
        with self._lock:
            self._check()
            return Listing([ObjectInfo(k, len(v)) for k, v in sorted(self.objects.items()) if k.startswith(prefix)])

    def delete(self, key: str) -> None:
        with self._lock:
            self._check()
            self.objects.pop(key, None)


class FsspecStore(ObjectStore):
    """A `file://` prefix (localfs: safe against hostile entries, bounded in time) or an `s3://` one (s3fs).
    Calls block: run them off event loops."""

    def __init__(self, cfg: StoreConfig) -> None:
        if cfg.url is None:
            raise StoreSetupError("transport.store.url is not set (file:///shared/dir or s3://bucket/prefix)")
        self.url = cfg.url.rstrip("/")
        parts = urlsplit(self.url)
        self.local = parts.scheme == "file"
        if self.local:
            self.root = parts.path.rstrip("/") or "/"
            self.watchdog = localfs.Watchdog(cfg.timeout_s)
        else:
            self.bucket = parts.netloc
            self.root = (parts.netloc + parts.path).rstrip("/")
            self.fs = _s3_filesystem(cfg)

    def _path(self, key: str) -> str:
        if not key or key.startswith("/") or "\0" in key or any(p in ("", ".", "..") for p in key.split("/")):
            raise ValueError(f"invalid object key {key!r}")
        return f"{self.root}/{key}"

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError as err:
            raise ObjectMissing(f"{what}: {err}") from None
        except PermissionError as err:
            raise StoreSetupError(
                f"access denied to {self.url} ({what}): give this role the permissions docs/deployment.md lists ({err})"
            ) from None
        except Exception as err:
            raise _classify(self.url, what, err) from err

    def _local(self, what: str, key: str, fn: Callable[[localfs.Beat], T]) -> T:
        """Run a localfs call under the watchdog and map its outcome to the store's errors."""
        try:
            return self.watchdog.run(what, fn)
        except localfs.NotRegular as err:
            raise ObjectNotRegular(key, err.kind, f"{self.url}: {what}: {err}") from None
        except localfs.RootMissing as err:
            raise StoreUnavailable(f"{self.url}: {err.strerror}") from None
        except localfs.TooManyHung as err:
            raise StoreUnavailable(f"{self.url}: {err}") from None
        except localfs.Stalled as err:
            raise ObjectTimeout(key, f"{self.url}: {err}") from None
        except (FileNotFoundError, NotADirectoryError) as err:
            raise ObjectMissing(f"{what}: {err}") from None
        except PermissionError as err:
            raise StoreSetupError(
                f"access denied to {self.url} ({what}): give this role the permissions docs/deployment.md lists ({err})"
            ) from None
        except OSError as err:
            raise StoreUnavailable(f"{self.url}: {what}: {type(err).__name__}: {err}"[:500]) from None

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if not self.local:
            self._call(f"put {key}", self.fs.pipe_file, path, data)
            return
        try:
            self._local(f"put {key}", key, lambda beat: localfs.write(self.root, key, data, beat))
        except ObjectNotRegular:
            raise
        except ObjectMissing as err:  # a folder vanished under us, or a file is where a folder belongs
            raise StoreUnavailable(f"{self.url}: put {key}: {err}") from None

    def get(self, key: str, max_bytes: int) -> bytes:
        path = self._path(key)
        if self.local:
            return self._local(f"get {key}", key, lambda beat: localfs.read(self.root, key, max_bytes, beat))
        # a Range request: S3 sends at most max_bytes + 1 bytes (the slice guards against a server that ignores it)
        return bytes(self._call(f"get {key}", self.fs.cat_file, path, start=0, end=max_bytes + 1)[: max_bytes + 1])

    def list(self, prefix: str) -> Listing:
        if prefix:
            self._path(prefix.rstrip("/") or "/")  # the same rules as keys
        if self.local:
            found = self._local(f"list {prefix}", prefix, lambda beat: localfs.scan(self.root, prefix, beat))
            files, skipped = found
            return Listing([ObjectInfo(k, n) for k, n in files], [Skipped(k, kind) for k, kind in skipped])
        base = f"{self.root}/{prefix}".rstrip("/")
        from fsspec.asyn import sync  # s3fs's dependency: only s3:// stores get here

        try:  # one LIST request per 1,000 keys (`fs.find` adds a HEAD and a second LIST when nothing is there)
            found = self._call(f"list {prefix}", sync, self.fs.loop, self.fs._lsdir, base, delimiter="")
        except ObjectMissing:
            raise BucketMissing(f"{self.url}: the bucket {self.bucket!r} is not there") from None
        out = []
        for info in found:
            path = info.get("name", "")
            if not path.startswith(self.root + "/") or info.get("type") == "directory":
                continue
            key = path[len(self.root) + 1 :]
            if key.startswith(prefix) and not key.rsplit("/", 1)[-1].startswith(TMP_PREFIX):
                out.append(ObjectInfo(key, int(info.get("size") or 0)))
        return Listing(sorted(out, key=lambda o: o.key))

    def delete(self, key: str) -> None:
        """A symlink, FIFO, socket or device under `key` is unlinked too (never opened); a folder is refused."""
        path = self._path(key)
        try:
            if self.local:
                self._local(f"delete {key}", key, lambda beat: localfs.remove(self.root, key, beat))
            else:
                self._call(f"delete {key}", self.fs.rm_file, path)
        except ObjectNotRegular:
            raise
        except ObjectMissing:
            pass

    def delete_many(self, keys: list[str]) -> None:
        """On S3 one DeleteObjects request per 1,000 keys (s3fs's `rm` of a list) instead of a DELETE each: the
        same permission (s3:DeleteObject), missing keys fine. S3 answers a key it could not delete in the
        response's `Errors` without failing the request; such an object stays, as after a DELETE lost on the way
        (the caller, a sampler, deletes replies it read and their uploads: a reply left behind is never read again,
        an upload left behind is deleted by the learner `intake.LEFTOVER_S` after its reply)."""
        if self.local or len(keys) < 2:
            super().delete_many(keys)
            return
        self._call(f"delete {len(keys)} objects", self.fs.rm, [self._path(key) for key in keys])

    def check(self, list_prefix: str, probe_key: str | None) -> None:
        """Fail now, with one line, if the store cannot be used: bucket absent, no credentials, access denied.
        Lists `list_prefix` (a role may only list its own prefix) and, with `probe_key`, writes and deletes an
        object there (roles that write)."""
        if self.local and not os.path.isdir(self.root):
            try:
                os.makedirs(self.root, exist_ok=True)
            except OSError as err:
                raise StoreSetupError(f"cannot create {self.root} for {self.url}: {err}") from None
        try:
            self.list(list_prefix)
            if probe_key is not None:
                self.put(probe_key, b"heterorl write probe")
                self.delete(probe_key)
        except BucketMissing:
            where = self.fs.endpoint_url or "AWS"
            raise StoreSetupError(f"bucket {self.bucket!r} does not exist at {where}: create it first") from None
        except StoreUnavailable as err:
            raise StoreSetupError(f"cannot use the store {self.url}: {err}") from None


def _classify(url: str, what: str, err: Exception) -> Exception:
    """Map a backend error to StoreSetupError (a person must act) or StoreUnavailable (retry)."""
    name = type(err).__name__
    if name in ("NoCredentialsError", "PartialCredentialsError", "ProfileNotFound"):
        return StoreSetupError(
            f"no usable S3 credentials for {url} ({err}): set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or "
            "transport.store.profile / access_key_env"
        )
    if name in ("InvalidAccessKeyId", "SignatureDoesNotMatch") or "InvalidAccessKeyId" in str(err):
        return StoreSetupError(f"the store at {url} refused the credentials ({err})")
    if isinstance(err, OSError | TimeoutError) or _is_botocore(err):
        return StoreUnavailable(f"{url}: {what}: {name}: {err}"[:500])
    return err


def _is_botocore(err: Exception) -> bool:
    return any(c.__module__.startswith(("botocore", "aiobotocore", "aiohttp")) for c in type(err).__mro__)


def _no_continue_for_small_puts(request: Any, **_: Any) -> None:
    """botocore asks every PutObject to wait for "100 Continue" before it sends the body (the body becomes a file
    object, and a file object gets `Expect: 100-continue`): one more round trip per upload, which over a 100 ms link
    made a 4 kB PUT take three round trips instead of one. The wait saves sending a large body the store would refuse;
    below `CONTINUE_MIN_BYTES` (the AWS SDK for Go's threshold) it costs more than the body, so it is dropped.
    (SigV4 never signs `Expect`, so the request's signature is the same either way.)"""
    if request.headers.get("Expect") != "100-continue":
        return
    body = request.body
    try:
        size = len(body.getbuffer()) if hasattr(body, "getbuffer") else len(body or b"")
    except TypeError:  # a stream of unknown length: keep the wait
        return
    if size < CONTINUE_MIN_BYTES:
        del request.headers["Expect"]


def _timestamp(value: str) -> datetime:
    """botocore's default timestamp parser (dateutil's) took half the client's CPU of a 200-object listing (one
    per object): S3 writes ISO 8601 in listings and RFC 1123 in headers, which the standard library parses."""
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        pass
    try:
        return email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        from botocore.utils import parse_timestamp  # s3fs's dependency: anything else, as botocore would

        return parse_timestamp(value)


def _s3_filesystem(cfg: StoreConfig) -> Any:
    try:
        import s3fs
    except ImportError:
        raise StoreSetupError("s3:// stores need s3fs: pip install 'heterorl[store]'") from None
    creds: dict[str, Any] = {}
    for field, env in (("key", cfg.access_key_env), ("secret", cfg.secret_key_env), ("token", cfg.session_token_env)):
        if env is not None:
            value = os.environ.get(env)
            if not value:
                raise StoreSetupError(f"transport.store names ${env} for the S3 {field}, but it is not set")
            creds[field] = value
    if ("key" in creds) != ("secret" in creds):
        raise StoreSetupError("transport.store: set both access_key_env and secret_key_env, or neither")
    from aiobotocore.session import AioSession  # s3fs's own dependency

    session = AioSession(profile=cfg.profile)
    session.get_component("event_emitter").register_last("before-sign.s3.PutObject", _no_continue_for_small_puts)
    session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=_timestamp)
    client: dict[str, Any] = {} if cfg.region is None else {"region_name": cfg.region}
    fs = s3fs.S3FileSystem(
        session=session,
        endpoint_url=cfg.endpoint_url,
        client_kwargs=client,
        config_kwargs={
            "connect_timeout": cfg.timeout_s,
            "read_timeout": cfg.timeout_s,
            "retries": {"max_attempts": 2, "mode": "standard"},
        },
        use_listings_cache=False,  # listings must be fresh: they are how rollouts and receipts are found
        skip_instance_cache=True,
        **creds,
    )
    fs.retries = 1  # no s3fs retry loop on top of botocore's one retry: callers back off (and count it)
    return fs


def open_store(cfg: StoreConfig) -> FsspecStore:
    """The configured store (no request made yet; call `check` to fail early on a mistake)."""
    return FsspecStore(cfg)
