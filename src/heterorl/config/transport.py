"""Which transport carries weights and rollout groups: the learner's HTTP service or an object store.

An object store (a shared file system as in HeteroRL, or any S3-compatible bucket) lets the learner upload each
version once whatever the number of samplers, and lets samplers behind NAT pull at their own pace
(docs/deployment.md). Credentials never appear here: the config names at most the environment variables that
hold them, so the resolved config.yaml in a run directory carries no secret.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from heterorl.config.base import Strict

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_PREFIX = re.compile(r"^[A-Za-z0-9._/-]*$")
_ENV = r"^[A-Za-z_][A-Za-z0-9_]*$"


def check_store_url(url: str) -> str:
    """`file:///absolute/dir` or `s3://bucket[/prefix]`; anything else is refused with one line saying why."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError(f"{url!r}: a file URL needs an absolute path, e.g. file:///shared/heterorl/run1")
        if parts.query or parts.fragment:
            raise ValueError(f"{url!r}: a store URL takes no query or fragment")
        return url
    if parts.scheme == "s3":
        if "@" in parts.netloc or ":" in parts.netloc:
            raise ValueError(f"{url!r}: credentials never go in the URL; use the environment (docs/deployment.md)")
        if not _BUCKET.match(parts.netloc):
            raise ValueError(f"{url!r}: {parts.netloc!r} is not a valid bucket name (3-63 of a-z 0-9 . -)")
        if parts.query or parts.fragment or not _PREFIX.match(parts.path) or "//" in parts.path:
            raise ValueError(f"{url!r}: the prefix may hold only A-Z a-z 0-9 . _ - and single slashes")
        return url
    raise ValueError(f"{url!r}: the store URL must start with file:// or s3:// (got scheme {parts.scheme!r})")


class StoreConfig(Strict):
    """Where the store is and how the learner and samplers use it."""

    url: str | None = Field(
        None, description="file:///shared/dir or s3://bucket/prefix (one prefix per run); required by live runs."
    )
    endpoint_url: str | None = Field(
        None, description="S3-compatible endpoint (R2, MinIO, GCS); None: AWS, or $AWS_ENDPOINT_URL when set."
    )
    region: str | None = Field(None, pattern=r"^[a-z0-9-]{1,32}$", description="S3 region; None: the default.")
    profile: str | None = Field(None, min_length=1, description="AWS named profile (~/.aws) holding credentials.")
    access_key_env: str | None = Field(
        None, pattern=_ENV, description="Variable holding the access key id; None: botocore's usual chain."
    )
    secret_key_env: str | None = Field(
        None, pattern=_ENV, description="Variable holding the secret access key (with access_key_env)."
    )
    session_token_env: str | None = Field(None, pattern=_ENV, description="Variable holding a session token.")
    poll_seconds: float = Field(
        2.0,
        gt=0.0,
        le=600.0,
        description="Longest wait between two looks at the store while nothing is there (manifest, replies, uploads); "
        "after something was found the next look is at once, then waits double from first_poll_seconds.",
    )
    first_poll_seconds: float = Field(
        0.05, gt=0.0, le=600.0, description="The first wait of a quiet spell between two looks at the store."
    )
    busy_poll_seconds: float = Field(
        2.0,
        ge=0.0,
        le=3600.0,
        description="For this long after the learner last found uploads, and after a sampler wrote an upload (its "
        "reply is due), the store is looked at every first_poll_seconds; only then do the waits double.",
    )
    retention_seconds: float = Field(
        600.0, ge=0.0, le=604_800.0, description="Objects dropped from the manifest stay this long (slow readers)."
    )
    merged_patches: bool = Field(
        True, description="Also upload power-of-two merged patches, so a far-behind sampler downloads few objects."
    )
    max_manifest_bytes: int = Field(
        2**20, ge=4096, le=2**28, description="Largest manifest a sampler reads (anything larger is refused)."
    )
    intake_workers: int = Field(
        4,
        ge=1,
        le=64,
        description="Sampler sessions whose uploads the learner reads, answers and deletes at once (each session's "
        "in order); live only: the simulated store takes no time for them.",
    )
    timeout_s: float = Field(30.0, gt=0.0, le=3600.0, description="Connect/read timeout of one store request.")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_store_url(value)

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r}: the endpoint must be an http(s)://host[:port] URL")
        if parts.username or parts.password:
            raise ValueError(f"{value!r}: credentials never go in the endpoint URL; use the environment")
        return value


class TransportConfig(Strict):
    """Which way weights and rollout groups travel; any mix works (e.g. weights through a store, rollouts over HTTP).

    The learner always serves HTTP for status (and for admission when `cluster.eta` is set); samplers need its URL
    only when something travels over HTTP or `cluster.eta` is set. The simulator models either way.
    """

    weights: Literal["http", "store"] = Field("http", description="Weights: learner's HTTP service, or the store.")
    rollouts: Literal["http", "store"] = Field("http", description="Rollout groups: HTTP POSTs, or the store.")
    store: StoreConfig = Field(default_factory=StoreConfig, description="The object store (when either uses it).")

    @property
    def uses_store(self) -> bool:
        return "store" in (self.weights, self.rollouts)
