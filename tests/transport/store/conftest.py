"""Stores for the store-transport tests: a real S3 wire protocol on loopback (moto's server, started once per
session) and a `file://` directory. Credentials are moto's dummy ones, set in the environment only."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

MOTO_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (a free port), for the whole session."""
    from moto.server import ThreadedMotoServer  # the `store` test extra installs it: no silent skip

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{server._server.server_port}"
    server.stop()


def make_bucket(endpoint: str) -> str:
    import boto3

    name = f"heterorl-{secrets.token_hex(4)}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["file", "s3"])
def store_overrides(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Config overrides that point a run at a fresh store: a directory, or a fresh bucket on moto's server."""
    if request.param == "file":
        return [f"transport.store.url={(tmp_path / 'store').as_uri()}"]
    endpoint = request.getfixturevalue("moto_endpoint")
    for key, value in MOTO_ENV.items():
        monkeypatch.setenv(key, value)
    bucket = make_bucket(endpoint)
    return [f"transport.store.url=s3://{bucket}/runs/r1", f"transport.store.endpoint_url={endpoint}"]
