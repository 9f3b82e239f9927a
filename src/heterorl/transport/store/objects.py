"""Objects under one URL prefix: put (atomic), get (bounded), list, delete -- through fsspec, or in memory.

`FsspecStore` serves `file://` (a shared or network file system: HeteroRL's set-up) and `s3://` (AWS S3, Cloudflare
R2, MinIO, GCS's S3 API, via s3fs); `MemoryStore` is the same interface in a dict, for the simulator and tests.
Every store operation ends in one of four ways: it worked; `ObjectMissing` (no such object); `StoreUnavailable`
(the store did not answer or failed: retry with backoff); `StoreSetupError` (a mistake only a person can fix:
no credentials, access denied, no bucket -- one line that says what to do).

Atomic puts: an S3 PUT becomes visible whole or not at all; on a file system the bytes go to a hidden temporary
name in the same directory and are renamed into place (rename is atomic on POSIX file systems and NFS), and
listings skip the temporary names. A reader therefore never sees half an object written by heterorl.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from heterorl.config import StoreConfig

TMP_PREFIX = ".tmp-"


class StoreUnavailable(OSError):  # noqa: N818 (reads as a state: "the store is unavailable")
    """The store did not answer, or failed (outage, timeout, 5xx): retry later."""


class BucketMissing(StoreUnavailable):
    """The bucket itself is not there (deleted, or a typo in the URL)."""


class ObjectMissing(LookupError):  # noqa: N818
    """No object under that key (never written, deleted by retention, or lost)."""


class StoreSetupError(RuntimeError):
    """The store cannot be used as configured; the message says why and what to do."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str  # relative to the store's root, '/'-separated
    size: int


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
    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with `prefix` (a folder, ending in '/'), sorted by key."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; a missing one is fine."""


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

    def list(self, prefix: str) -> list[ObjectInfo]:
        with self._lock:
            self._check()
            return [ObjectInfo(k, len(v)) for k, v in sorted(self.objects.items()) if k.startswith(prefix)]

    def delete(self, key: str) -> None:
        with self._lock:
            self._check()
            self.objects.pop(key, None)


class FsspecStore(ObjectStore):
    """A `file://` or `s3://` prefix through fsspec (s3fs for S3). Calls block: run them off event loops."""

    def __init__(self, cfg: StoreConfig) -> None:
        if cfg.url is None:
            raise StoreSetupError("transport.store.url is not set (file:///shared/dir or s3://bucket/prefix)")
        self.url = cfg.url.rstrip("/")
        parts = urlsplit(self.url)
        self.local = parts.scheme == "file"
        if self.local:
            import fsspec

            self.root = parts.path.rstrip("/") or "/"
            self.fs: Any = fsspec.filesystem("file")
        else:
            self.bucket = parts.netloc
            self.root = (parts.netloc + parts.path).rstrip("/")
            self.fs = _s3_filesystem(cfg)

    def _path(self, key: str) -> str:
        if not key or key.startswith("/") or ".." in key.split("/"):
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

    def _check_root(self) -> None:
        """A vanished mount must not look like an empty folder (a sampler would take absent groups as consumed)."""
        if self.local and not os.path.isdir(self.root):
            raise StoreUnavailable(f"{self.url}: the directory is not there (file system unmounted?)")

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        if not self.local:
            self._call(f"put {key}", self.fs.pipe_file, path, data)
            return
        self._check_root()
        folder, name = path.rsplit("/", 1)
        tmp = f"{folder}/{TMP_PREFIX}{secrets.token_hex(6)}-{name}"
        try:
            os.makedirs(folder, exist_ok=True)
            self._call(f"put {key}", self.fs.pipe_file, tmp, data)
            self._call(f"put {key}", self.fs.mv, tmp, path)
        except (ObjectMissing, FileNotFoundError) as err:  # the folder vanished under us
            raise StoreUnavailable(f"{self.url}: put {key}: {err}") from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def get(self, key: str, max_bytes: int) -> bytes:
        if self.local:
            self._check_root()
        return bytes(self._call(f"get {key}", self.fs.cat_file, self._path(key), start=0, end=max_bytes + 1))

    def list(self, prefix: str) -> list[ObjectInfo]:
        self._check_root()
        base = f"{self.root}/{prefix}".rstrip("/")
        try:
            found = self._call(f"list {prefix}", self.fs.find, base, detail=True)
        except ObjectMissing:
            if self.local:
                return []
            raise BucketMissing(f"{self.url}: the bucket {self.bucket!r} is not there") from None
        out = []
        for path, info in found.items():
            if not path.startswith(self.root + "/") or info.get("type") == "directory":
                continue
            key = path[len(self.root) + 1 :]
            if not key.rsplit("/", 1)[-1].startswith(TMP_PREFIX):
                out.append(ObjectInfo(key, int(info.get("size") or 0)))
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        with contextlib.suppress(ObjectMissing):
            self._call(f"delete {key}", self.fs.rm_file, self._path(key))

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
    if cfg.profile is not None:
        creds["profile"] = cfg.profile
    client: dict[str, Any] = {} if cfg.region is None else {"region_name": cfg.region}
    fs = s3fs.S3FileSystem(
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
