"""Weights through a real store (a directory and moto's S3 server): the learner's objects and manifest, the
sampler's cheapest chain, and every fault the issue names -- torn, missing, wrong hash, stale manifest, outage --
survived (the receiver ends bit-identical to the learner's newest version) and counted."""

from __future__ import annotations

import asyncio
import io
import random
import threading
import time
from pathlib import Path

import pytest
import torch

from heterorl.config import LiveConfig, StoreConfig, load_config
from heterorl.eventlog import EventLog
from heterorl.transport.backoff import Backoff
from heterorl.transport.store.manifest import MANIFEST_KEY, Manifest, plan
from heterorl.transport.store.objects import FsspecStore, ObjectStore, StoreSetupError
from heterorl.transport.store.publisher import StorePublisher
from heterorl.transport.store.source import StoreWeightSource
from heterorl.transport.tcp_relay import TcpRelay
from heterorl.weights import WeightReceiver, WeightStore, make_codec, merge_patches
from heterorl.weights.envelope import decode_update
from transport.store.conftest import MOTO_ENV, make_bucket


class Learner:
    """A WeightStore publishing sparse steps of a small model, and its publisher into `objects`."""

    def __init__(self, objects: ObjectStore, cfg: StoreConfig, resume: bool = False, clock=None) -> None:
        gen = torch.Generator().manual_seed(0)
        self.weights = {"w": torch.randn(96, 64, generator=gen), "b": torch.randn(512, generator=gen)}
        self.gen = gen
        self.store = WeightStore(make_codec("pulse"), snapshot_every=8, max_chain=16, retain=64)
        self.store.wire_dtype = torch.bfloat16
        self.uploaded: list[tuple[int, int]] = []
        kw = {} if clock is None else {"clock": clock}
        self.pub = StorePublisher(
            objects, self.store, cfg, resume=resume, on_uploaded=lambda v, n, f: self.uploaded.append((v, n)), **kw
        )
        self.version = -1

    def step(self) -> None:
        self.version += 1
        if self.version:
            for t in self.weights.values():
                mask = torch.rand(t.shape, generator=self.gen) < 0.05
                t.add_(torch.randn(t.shape, generator=self.gen) * 0.05 * mask)
        self.pub.published(self.store.publish(self.version, self.weights))
        self.pub.drain()


def source(objects: ObjectStore, cfg: StoreConfig) -> StoreWeightSource:
    backoff = Backoff(0.01, 0.05, random.Random(0))
    live = LiveConfig(patience_s=30)
    return StoreWeightSource(objects, cfg, live, "s0", backoff, EventLog(io.StringIO()), lambda p: merge_patches(p))


def pull(src: StoreWeightSource, receiver: WeightReceiver, wait: float = 0.0) -> bool:
    got = asyncio.run(src.pull(*receiver.held(), wait, 0.5, 0))
    return isinstance(got, bytes) and receiver.apply(decode_update(got))


@pytest.fixture
def objects(store_overrides: list[str]) -> FsspecStore:
    cfg = load_config(None, store_overrides).transport.store
    store = FsspecStore(cfg.model_copy(update={"poll_seconds": 0.01, "retention_seconds": 3600}))
    store.check("weights/", "probe")
    return store


def cfg_of(objects: FsspecStore, **kw) -> StoreConfig:
    return StoreConfig(poll_seconds=0.01, retention_seconds=3600, **kw)


def test_chain_and_merged_patches_reach_the_newest_version_bit_identical(objects: FsspecStore) -> None:
    cfg = cfg_of(objects)
    learner, src, receiver = Learner(objects, cfg), source(objects, cfg), WeightReceiver()
    for _ in range(7):
        learner.step()
    assert pull(src, receiver)
    assert receiver.held() == (learner.store.latest_version, learner.store.latest_hash)  # from the snapshot
    manifest = Manifest.parse(objects.get(MANIFEST_KEY, 2**20), 2**20)
    spans = {(o.base, o.version) for o in manifest.objects if o.kind == "patch"}
    assert {(0, 2), (0, 4), (4, 6)} <= spans  # power-of-two merged patches, as the docstring says
    assert {(v - 1, v) for v in range(1, 7)} <= spans
    learner.step()  # version 7
    learner.step()  # version 8: a new snapshot
    before = src.downloaded
    assert pull(src, receiver)
    assert receiver.held() == (8, learner.store.latest_hash)
    assert src.downloaded - before < manifest.objects[0].nbytes  # two small patches, not a snapshot
    assert not src.counts


class SlowGets:
    """The store with every object read taking 0.2 s (a long link), counting reads in flight at once."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner, self.lock = inner, threading.Lock()
        self.running = self.most = 0

    def get(self, key: str, max_bytes: int) -> bytes:
        if key == MANIFEST_KEY:
            return self.inner.get(key, max_bytes)
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.2)
        with self.lock:
            self.running -= 1
        return self.inner.get(key, max_bytes)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_a_chain_s_objects_are_downloaded_at_once(objects: FsspecStore) -> None:
    """Over a long link each GET is a round trip: a chain of k objects must cost one, not k."""
    cfg = cfg_of(objects)
    learner, slow, receiver = Learner(objects, cfg), SlowGets(objects), WeightReceiver()
    for _ in range(8):
        learner.step()
    src = source(slow, cfg)  # type: ignore[arg-type]
    assert pull(src, receiver)
    assert receiver.held() == (learner.store.latest_version, learner.store.latest_hash)
    manifest = Manifest.parse(objects.get(MANIFEST_KEY, 2**20), 2**20)
    assert len(plan(manifest, None, None) or []) >= 3  # a snapshot and patches
    assert slow.most >= 3  # ... read at once


def test_uploads_are_once_per_version_and_the_manifest_is_last(objects: FsspecStore) -> None:
    cfg = cfg_of(objects)
    puts: list[str] = []
    put = objects.put

    def recording_put(key: str, data: bytes) -> None:
        puts.append(key)
        put(key, data)

    objects.put = recording_put  # type: ignore[method-assign]
    learner = Learner(objects, cfg)
    for _ in range(5):
        learner.step()
    assert [v for v, _ in learner.uploaded] == [0, 1, 2, 3, 4]
    manifests = [i for i, k in enumerate(puts) if k == MANIFEST_KEY]
    assert len(manifests) == 5
    manifest = Manifest.parse(objects.get(MANIFEST_KEY, 2**20), 2**20)
    for ref in manifest.objects:  # every object the manifest names was put before it
        assert puts.index(ref.key) < manifests[-1]
    assert sum(n for _, n in learner.uploaded) == learner.pub.uploaded_bytes
    assert len(set(puts)) == len(puts) - 4  # nothing uploaded twice except the manifest


@pytest.mark.parametrize("fault", ["torn", "missing", "bad_hash"])
def test_a_bad_object_is_counted_and_a_snapshot_replaces_it(objects: FsspecStore, fault: str) -> None:
    cfg = cfg_of(objects)
    learner, src, receiver = Learner(objects, cfg), source(objects, cfg), WeightReceiver()
    for _ in range(3):
        learner.step()
    assert pull(src, receiver)
    learner.step()
    learner.step()  # version 4: the receiver (at 2) takes patches 2 -> 3 -> 4 (or the snapshot + merged 0 -> 4)
    manifest = Manifest.parse(objects.get(MANIFEST_KEY, 2**20), 2**20)
    (patch,) = [o for o in manifest.objects if (o.base, o.version) == (2, 3)]
    data = objects.get(patch.key, patch.nbytes)
    if fault == "torn":
        objects.put(patch.key, data[: len(data) // 2])
    elif fault == "missing":
        objects.delete(patch.key)
    else:
        objects.put(patch.key, bytes([data[0] ^ 1]) + data[1:])
    assert pull(src, receiver)
    assert receiver.held() == (4, learner.store.latest_hash)
    assert src.counts == {fault: 1}


def test_a_stale_or_broken_manifest_is_ignored_and_counted(objects: FsspecStore) -> None:
    cfg = cfg_of(objects)
    learner, src, receiver = Learner(objects, cfg), source(objects, cfg), WeightReceiver()
    learner.step()
    old = objects.get(MANIFEST_KEY, 2**20)
    learner.step()
    assert pull(src, receiver)
    assert receiver.version == 1
    objects.put(MANIFEST_KEY, old)  # a replica or cache serving an older manifest
    assert not pull(src, receiver)
    objects.put(MANIFEST_KEY, b'{"format": "heterorl.store.v1", "run": 1}')
    assert not pull(src, receiver)
    assert src.counts == {"stale_manifest": 1, "bad_manifest": 1}
    learner.step()  # the learner writes a newer manifest: the sampler moves on
    assert pull(src, receiver)
    assert receiver.held() == (2, learner.store.latest_hash)


@pytest.fixture(params=["file", "s3"])
def outage(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """(store, down, up): a directory moved away and back, or a moto server of its own stopped and restarted."""
    if request.param == "file":
        root = tmp_path / "store"
        store = FsspecStore(StoreConfig(url=root.as_uri()))
        store.check("weights/", None)
        yield store, lambda: root.rename(tmp_path / "away"), lambda: (tmp_path / "away").rename(root)
        return
    endpoint = request.getfixturevalue("moto_endpoint")
    for key, value in MOTO_ENV.items():
        monkeypatch.setenv(key, value)
    host, port = endpoint.removeprefix("http://").split(":")
    relay = TcpRelay((host, int(port)))  # the store as the sampler and learner see it: cut off at will
    url = f"s3://{make_bucket(endpoint)}/r"
    store = FsspecStore(StoreConfig(url=url, endpoint_url=f"http://{relay.url_host}", timeout_s=1.0))
    yield store, relay.down, relay.restore
    relay.close()


def test_a_store_outage_is_survived_and_counted(outage) -> None:
    objects, down, up = outage
    cfg = cfg_of(objects)
    learner, src, receiver = Learner(objects, cfg), source(objects, cfg), WeightReceiver()
    learner.step()
    assert pull(src, receiver)
    learner.step()
    down()

    async def pull_through_the_outage() -> bytes | str | None:
        task = asyncio.create_task(src.pull(*receiver.held(), 0.0, 0.5, 0))
        await asyncio.sleep(3.0)
        assert not task.done()  # it keeps retrying while the store is away
        up()
        return await asyncio.wait_for(task, 30)

    got = asyncio.run(pull_through_the_outage())
    assert isinstance(got, bytes)
    assert receiver.apply(decode_update(got))
    assert receiver.held() == (1, learner.store.latest_hash)
    assert src.counts["outage"] >= 1
    assert set(src.counts) == {"outage"}


def test_a_fresh_run_refuses_a_used_prefix_and_a_resumed_one_continues_it(objects: FsspecStore) -> None:
    cfg = cfg_of(objects)
    learner = Learner(objects, cfg)
    learner.step()
    with pytest.raises(StoreSetupError, match="already holds a run"):
        Learner(objects, cfg)
    resumed = Learner(objects, cfg, resume=True)
    assert (resumed.pub.run, resumed.pub.epoch) == (learner.pub.run, 1)
    src, receiver = source(objects, cfg), WeightReceiver()
    assert pull(src, receiver)
    resumed.step()  # version 0 again, in epoch 1: newer than epoch 0's version 0
    assert not src.counts


def test_retention_deletes_objects_that_left_the_manifest_after_the_grace_period(objects: FsspecStore) -> None:
    now = [0.0]
    cfg = cfg_of(objects).model_copy(update={"retention_seconds": 10.0})
    learner = Learner(objects, cfg, clock=lambda: now[0])
    learner.store.retain = 2
    for _ in range(10):  # a snapshot at 8 retires versions before it
        learner.step()
    listed = {o.key for o in Manifest.parse(objects.get(MANIFEST_KEY, 2**20), 2**20).objects}
    stored = {o.key for o in objects.list("weights/objects/")}
    assert listed < stored  # retired objects are still there for slow readers
    now[0] = 11.0
    learner.step()
    stored = {o.key for o in objects.list("weights/objects/")}
    listed = {o.key for o in Manifest.parse(objects.get(MANIFEST_KEY, 2**20), 2**20).objects}
    assert stored == listed
