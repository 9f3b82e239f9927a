"""Signed weights through a real store: with the learner's key the publisher signs every object and manifest; a
sampler holding the public key follows the chain hop by hop to the newest version bit for bit, and whoever can
write the store can neither feed it weights nor pin it with a forged manifest."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import random
from pathlib import Path

import pytest
import torch

from heterorl.config import LiveConfig, StoreConfig
from heterorl.eventlog import EventLog
from heterorl.transport.http.client import Backoff
from heterorl.transport.store.manifest import MANIFEST_KEY, Manifest, digest, object_key
from heterorl.transport.store.objects import FsspecStore
from heterorl.transport.store.publisher import StorePublisher
from heterorl.transport.store.source import StoreWeightSource
from heterorl.weights import WeightReceiver, WeightStore, make_codec, merge_patches
from heterorl.weights.envelope import decode_update
from heterorl.weights.signing import Authority, Signer, load_private_key, load_public_key, write_keypair
from transport.store.test_weights import objects as objects_fixture

objects = objects_fixture  # the store fixture (a directory, moto's S3)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_keypair(tmp_path_factory.mktemp("keys"))


class SignedLearner:
    """A WeightStore publishing sparse steps of a small model through a signing StorePublisher."""

    def __init__(self, objects: FsspecStore, key_path: Path) -> None:
        gen = torch.Generator().manual_seed(0)
        self.weights = {"w": torch.randn(96, 64, generator=gen), "b": torch.randn(512, generator=gen)}
        self.gen = gen
        self.store = WeightStore(make_codec("pulse"), snapshot_every=8, max_chain=16, retain=64)
        self.store.wire_dtype = torch.bfloat16
        cfg = StoreConfig(poll_seconds=0.01, retention_seconds=3600)
        self.pub = StorePublisher(objects, self.store, cfg, resume=False, signing_key=load_private_key(key_path))
        self.version = -1

    def step(self) -> None:
        self.version += 1
        if self.version:
            for t in self.weights.values():
                t.add_(
                    torch.randn(t.shape, generator=self.gen) * 0.05 * (torch.rand(t.shape, generator=self.gen) < 0.05)
                )
        self.pub.published(self.store.publish(self.version, self.weights))
        self.pub.drain()


def source(objects: FsspecStore, authority: Authority | None) -> StoreWeightSource:
    cfg = StoreConfig(poll_seconds=0.01, retention_seconds=3600)
    backoff = Backoff(0.01, 0.05, random.Random(0))
    events = EventLog(io.StringIO())
    return StoreWeightSource(
        objects, cfg, LiveConfig(patience_s=30), "s0", backoff, events, merge_patches, authority=authority
    )


def pull(src: StoreWeightSource, receiver: WeightReceiver) -> bool:
    got = asyncio.run(src.pull(*receiver.held(), 0.0, 0.5, 0))
    return isinstance(got, bytes) and receiver.apply(decode_update(got))


def catch_up(src: StoreWeightSource, receiver: WeightReceiver) -> int:
    """Pull until current; returns the number of updates applied (hops)."""
    hops = 0
    while pull(src, receiver):
        hops += 1
    return hops


def test_a_signed_chain_is_followed_hop_by_hop_to_the_newest_version(objects, keys) -> None:
    learner = SignedLearner(objects, keys[0])
    authority = Authority(load_public_key(keys[1]))
    src, receiver = source(objects, authority), WeightReceiver(authority=authority)
    for _ in range(7):
        learner.step()
    manifest = Manifest.parse(objects.get(MANIFEST_KEY, 2**20), 2**20)
    assert manifest.signature is not None
    assert all(o.sig is not None and o.sig[0] == 0 for o in manifest.objects)
    assert catch_up(src, receiver) >= 1
    assert receiver.held() == (6, learner.store.latest_hash)
    for _ in range(5):
        learner.step()  # 7 .. 11 (a snapshot at 8)
    assert catch_up(src, receiver) >= 2  # one signed hop per pull: no merged patch without a signature
    assert receiver.held() == (11, learner.store.latest_hash)
    expected = {k: v.to(torch.bfloat16) for k, v in learner.weights.items()}
    assert all(torch.equal(receiver.weights[k], expected[k]) for k in expected)
    assert not src.counts
    assert not receiver.refusals


def forged_manifest(objects: FsspecStore, *, epoch: int, signer: Signer | None) -> bytes:
    """What a store writer can make: the newest manifest with a huge epoch, and a forged newest version whose
    snapshot (a consistent blob of other weights) it uploaded itself."""
    honest = Manifest.parse(objects.get(MANIFEST_KEY, 2**20), 2**20)
    evil = WeightStore(make_codec("pulse"), wire_dtype=torch.bfloat16)
    version = honest.latest[0] + 1
    evil.publish(version, {"w": torch.zeros(96, 64), "b": torch.zeros(512)})
    blob = evil.update_for(None, None).snapshot
    assert blob is not None
    d = digest(blob)
    ref_key = object_key("snapshot", None, version, d)
    objects.put(ref_key, blob)
    sig = None if signer is None else (0, signer.sign_blob(blob))
    ref = dataclasses.replace(honest.objects[0], key=ref_key, kind="snapshot", base=None, version=version)
    ref = dataclasses.replace(ref, nbytes=len(blob), digest=d, sig=sig)
    forged = Manifest(honest.run, epoch, 0, (*honest.versions, (version, evil.latest_hash)), (*honest.objects, ref))
    if signer is not None:
        forged = dataclasses.replace(forged, signature=signer.sign_manifest(forged.body()))
    return forged.to_bytes()


@pytest.mark.parametrize("forger", ["unsigned", "other_key"])
def test_a_forged_manifest_neither_feeds_nor_pins_a_sampler(objects, keys, tmp_path, forger) -> None:
    learner = SignedLearner(objects, keys[0])
    authority = Authority(load_public_key(keys[1]))
    src, receiver = source(objects, authority), WeightReceiver(authority=authority)
    learner.step()
    assert catch_up(src, receiver)
    mallory = None if forger == "unsigned" else Signer(load_private_key(write_keypair(tmp_path / "m")[0]))
    objects.put(MANIFEST_KEY, forged_manifest(objects, epoch=2**40, signer=mallory))
    assert not pull(src, receiver)  # refused: neither adopted nor applied
    assert not pull(src, receiver)  # ... and counted once
    assert src.counts == {"unsigned" if forger == "unsigned" else "bad_signature": 1}
    assert receiver.version == 0
    learner.step()  # the learner's next manifest (epoch 0) is followed at once: nothing was pinned
    assert catch_up(src, receiver)
    assert receiver.held() == (1, learner.store.latest_hash)


def test_without_a_key_a_forged_manifest_pins_a_sampler(objects, keys) -> None:
    """Today's trust, documented: hashes catch accidents, not a store writer (docs/deployment.md)."""
    learner = SignedLearner(objects, keys[0])
    src, receiver = source(objects, None), WeightReceiver()
    learner.step()
    assert pull(src, receiver)
    objects.put(MANIFEST_KEY, forged_manifest(objects, epoch=2**40, signer=None))
    assert pull(src, receiver)  # the forged weights are applied
    assert torch.count_nonzero(receiver.weights["w"]) == 0
    learner.step()
    assert not pull(src, receiver)  # and the learner's manifests are "stale" from now on: pinned
    assert src.counts["stale_manifest"] == 1


def test_a_signed_manifest_listing_an_unsigned_object_is_not_applied(objects, keys) -> None:
    """A learner-signed manifest only lists signed objects; an object whose bytes were replaced fails both the
    digest and the signature, and the sampler falls back to what is still good."""
    learner = SignedLearner(objects, keys[0])
    authority = Authority(load_public_key(keys[1]))
    src, receiver = source(objects, authority), WeightReceiver(authority=authority)
    for _ in range(3):
        learner.step()
    manifest = Manifest.parse(objects.get(MANIFEST_KEY, 2**20), 2**20)
    raw = json.loads(manifest.to_bytes())
    raw["objects"][-1].pop("sig")  # strip one object's signature and keep the learner's manifest signature
    objects.put(MANIFEST_KEY, json.dumps(raw).encode())
    assert not pull(src, receiver)
    assert src.counts == {"bad_signature": 1}  # the manifest no longer matches its signature
