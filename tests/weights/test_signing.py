"""Signed weights: a receiver holding the learner's public key applies only blobs the learner signed, never an
older version than it holds (within an epoch), and leaves its weights bit for bit as they were when it refuses."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest
import torch

from heterorl.framing import frame, unframe
from heterorl.weights import WeightReceiver, WeightStore, make_codec
from heterorl.weights.envelope import MAGIC, MAX_HEADER_BYTES, EnvelopeError, decode_update, encode_update, sign_update
from heterorl.weights.signing import (
    Authority,
    KeyFileError,
    Signer,
    authority_from,
    load_private_key,
    load_public_key,
    signer_from,
    write_keypair,
)

from ._helpers import bits_equal


def versions(n: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    w = {"a": torch.randn(48, 16, generator=gen), "b": torch.randn(40, generator=gen)}
    out = []
    for _ in range(n):
        w = {
            k: v + 0.05 * torch.randn(v.shape, generator=gen) * (torch.rand(v.shape, generator=gen) < 0.2)
            for k, v in w.items()
        }
        out.append(w)
    return out


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_keypair(tmp_path_factory.mktemp("keys") / "learner")


@pytest.fixture
def store() -> WeightStore:
    store = WeightStore(make_codec("pulse"), snapshot_every=100, wire_dtype=torch.bfloat16)
    for v, w in enumerate(versions(5)):
        store.publish(v, w)
    return store


def wire(update, signer=None):
    """Over the wire and back, as a sampler receives it."""
    return decode_update(encode_update(sign_update(update, signer)))


def snapshot_of(receiver: WeightReceiver) -> dict[str, torch.Tensor]:
    assert receiver.weights is not None
    return {k: v.clone() for k, v in receiver.weights.items()}


def test_key_files_have_safe_permissions_and_are_never_overwritten(tmp_path: Path) -> None:
    private, public = write_keypair(tmp_path / "k")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o700
    signer = signer_from(private, epoch=2)  # what `trust.learner_private_key` / `learner_public_key` give
    authority_from(public).verify_manifest(b"m", signer.sign_manifest(b"m"))
    assert (signer.epoch, signer_from(None, 0), authority_from(None)) == (2, None, None)
    with pytest.raises(KeyFileError, match="refusing to overwrite"):
        write_keypair(tmp_path / "k")
    os.chmod(private, 0o640)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_private_key(private)
    with pytest.raises(KeyFileError, match="not a PEM public key"):
        load_public_key(private)  # a private key is not a public one


def test_a_signed_update_applies_and_its_signatures_travel_in_the_envelope(store, keys) -> None:
    signer = Signer(load_private_key(keys[0]), epoch=3)
    receiver = WeightReceiver(authority=Authority(load_public_key(keys[1])))
    update = wire(store.update_for(None, None), signer)
    assert update.signatures is not None
    assert (update.signatures.epoch, len(update.signatures.blobs)) == (3, len(update.blobs))
    assert receiver.apply(update)
    assert receiver.held() == (store.latest_version, store.latest_hash)
    assert receiver.newest_signed == (3, store.latest_version)
    assert not receiver.refusals


@pytest.mark.parametrize("attack", ["unsigned", "other_key", "swapped", "other_epoch"])
def test_an_update_the_learner_did_not_sign_is_refused_and_nothing_changes(store, keys, tmp_path, attack) -> None:
    signer = Signer(load_private_key(keys[0]))
    receiver = WeightReceiver(authority=Authority(load_public_key(keys[1])))
    first = dict(versions(5)[0])
    store0 = WeightStore(make_codec("pulse"), wire_dtype=torch.bfloat16)
    store0.publish(0, first)
    assert receiver.apply(wire(store0.update_for(None, None), signer))
    held, before = receiver.held(), snapshot_of(receiver)
    update = store.update_for(None, None)  # a fully consistent update (hashes and all) to another version
    if attack == "unsigned":
        forged = wire(update)
    elif attack == "other_key":
        forged = wire(update, Signer(load_private_key(write_keypair(tmp_path / "mallory")[0])))
    elif attack == "swapped":  # the learner's real signatures, each on the other blob
        real = sign_update(update, signer).signatures
        assert len(real.blobs) == 2
        forged = wire(dataclasses.replace(update, signatures=dataclasses.replace(real, blobs=real.blobs[::-1])))
    else:  # the learner's signatures, with the epoch in the header raised to look newer
        signed = sign_update(update, signer)
        forged = dataclasses.replace(signed, signatures=dataclasses.replace(signed.signatures, epoch=9))
    assert not receiver.apply(forged)
    expected = "unsigned" if attack == "unsigned" else "bad_signature"
    assert receiver.refusals == {expected: 1}
    assert receiver.refused == 1
    assert receiver.held() == held  # still asks from the version it holds: that one is the learner's
    assert bits_equal(before, receiver.weights)


def test_a_replayed_old_update_is_refused_and_a_new_epoch_is_followed(store, keys) -> None:
    signer = Signer(load_private_key(keys[0]), epoch=0)
    receiver = WeightReceiver(authority=Authority(load_public_key(keys[1])))
    old = WeightStore(make_codec("pulse"), wire_dtype=torch.bfloat16)
    old.publish(1, versions(5)[1])
    replay = wire(old.update_for(None, None), signer)  # genuinely signed, at version 1
    assert receiver.apply(wire(store.update_for(None, None), signer))  # version 4
    before = snapshot_of(receiver)
    assert not receiver.apply(replay)
    assert receiver.refusals == {"replayed": 1}
    assert receiver.version == 4
    assert bits_equal(before, receiver.weights)
    resumed = Signer(signer.key, epoch=1)  # a resumed learner republishing version 1
    assert receiver.apply(wire(old.update_for(None, None), resumed))
    assert receiver.newest_signed == (1, 1)
    assert not receiver.apply(wire(store.update_for(None, None), signer))  # epoch 0 is over
    assert receiver.refusals == {"replayed": 2}


def test_patches_are_signed_too_and_a_receiver_without_a_key_takes_both(store, keys) -> None:
    signer = Signer(load_private_key(keys[0]))
    authority = Authority(load_public_key(keys[1]))
    signed, plain = WeightReceiver(authority=authority), WeightReceiver()
    early = WeightStore(make_codec("pulse"), snapshot_every=100, wire_dtype=torch.bfloat16)
    for v, w in enumerate(versions(5)[:2]):
        early.publish(v, w)
    for receiver in (signed, plain):
        assert receiver.apply(wire(early.update_for(None, None), signer))
    patch = store.update_for(1, early.latest_hash)
    assert patch.kind == "patch"
    assert signed.apply(wire(patch, signer))
    assert plain.apply(wire(patch))  # no key configured: today's behaviour, hashes only
    assert signed.held() == plain.held() == (4, store.latest_hash)


@pytest.mark.parametrize(
    "change",
    [{"sigs": ["zz" * 64, "00" * 64]}, {"sigs": ["00" * 64]}, {"sigs": "00" * 64}, {"epoch": -1}, {"epoch": True}],
)
def test_malformed_signature_fields_are_envelope_errors(store, keys, change) -> None:
    signed = sign_update(store.update_for(None, None), Signer(load_private_key(keys[0])))
    header, start = unframe(encode_update(signed), MAGIC, MAX_HEADER_BYTES, EnvelopeError)
    body = encode_update(signed)[start:]
    with pytest.raises(EnvelopeError, match=r"epoch|sigs"):
        decode_update(frame(MAGIC, {**header, **change}, body))


def test_the_signer_caches_signatures_of_blobs_served_again(keys) -> None:
    signer = Signer(load_private_key(keys[0]), cache=2)
    a, b, c = b"a" * 100, b"b" * 100, b"c" * 100
    sig_a = signer.sign_blob(a)
    assert signer.sign_blob(a) == sig_a
    signer.sign_blob(b)
    signer.sign_blob(c)
    assert len(signer._signed) == 2
    Authority(signer.public_key).verify_blobs([a, c], signer.sign_blobs(a, None, c))
