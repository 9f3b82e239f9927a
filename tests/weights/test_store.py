"""WeightStore / WeightReceiver: cadence, chain limits, retention, update choice, fallbacks, atomicity."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from heterorl.config import WeightsConfig
from heterorl.weights import (
    FullCodec,
    PulseCodec,
    PulseCtxCodec,
    Update,
    WeightReceiver,
    WeightStore,
    make_codec,
    patch_info,
    state_hash,
)
from heterorl.weights.format import bits_view, pack, unpack

from ._helpers import bits_equal


def trajectory(n: int, seed: int = 0, lr: float = 1e-5) -> list[dict[str, torch.Tensor]]:
    """fp32 master weights after each of n Adam-like steps (lr * sign(g))."""
    gen = torch.Generator().manual_seed(seed)
    w = {"layer.weight": torch.randn(64, 32, generator=gen) * 0.02, "norm.weight": torch.ones(32)}
    out = []
    for _ in range(n):
        w = {k: v - lr * torch.randn(v.shape, generator=gen).sign() for k, v in w.items()}
        out.append(w)
    return out


def bf16(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.bfloat16() for k, v in w.items()}


def make_store(codec: str = "pulse", **kw) -> WeightStore:
    return WeightStore(make_codec(codec), wire_dtype=torch.bfloat16, **kw)


def publish_all(store: WeightStore, versions: list[dict[str, torch.Tensor]]) -> list:
    return [store.publish(i, w) for i, w in enumerate(versions)]


def test_from_config():
    store = WeightStore.from_config(WeightsConfig(codec="full", snapshot_every=3, max_chain=4, retain=5))
    assert isinstance(store.codec, FullCodec)
    assert (store.snapshot_every, store.max_chain, store.retain, store.wire_dtype) == (3, 4, 5, torch.bfloat16)
    assert isinstance(WeightStore.from_config(WeightsConfig()).codec, PulseCodec)
    with pytest.raises(ValueError, match="unknown weight-sync codec"):
        make_codec("lz4")


def test_snapshot_cadence():
    published = publish_all(make_store(snapshot_every=3, max_chain=16), trajectory(8))
    assert [p.snapshot_nbytes is not None for p in published] == [i % 3 == 0 for i in range(8)]
    assert published[0].patch_nbytes is None
    assert all(p.patch_nbytes is not None and p.changed > 0 for p in published[1:])


def test_snapshot_when_the_chain_would_exceed_max_chain():
    published = publish_all(make_store(snapshot_every=100, max_chain=2), trajectory(8))
    assert [i for i, p in enumerate(published) if p.snapshot_nbytes is not None] == [0, 3, 6]


def test_updates_respect_max_chain():
    store = make_store(snapshot_every=100, max_chain=2)
    versions = trajectory(3)
    publish_all(store, versions)
    store.publish(3, versions[2])  # unchanged weights: an empty patch
    h = {v: state_hash(bf16(versions[min(v, 2)])) for v in range(4)}
    assert store.update_for(1, h[1]).kind == "patch"  # 2 patches behind
    assert store.update_for(0, h[0]).kind == "snapshot"  # 3 patches behind; snapshot 3 + nothing is served
    assert store.snapshot_version == 3


def test_retention_keeps_the_last_versions_and_the_chain_since_the_snapshot():
    store = make_store(snapshot_every=2, max_chain=16, retain=3)
    versions = trajectory(10)
    publish_all(store, versions)
    assert store.versions == (7, 8, 9)
    assert store.update_for(5, state_hash(bf16(versions[5]))).kind == "snapshot"  # dropped -> snapshot
    assert store.update_for(7, state_hash(bf16(versions[7]))).kind == "patch"
    assert store.patch_nbytes(7) is None  # its predecessor is gone, so is its patch
    short = make_store(snapshot_every=5, max_chain=16, retain=1)
    publish_all(short, trajectory(4))
    assert short.versions == (0, 1, 2, 3)  # a fresh receiver needs snapshot 0 + patches 1..3


def test_smallest_update_is_chosen():
    store = make_store(snapshot_every=2, max_chain=16)
    gen = torch.Generator().manual_seed(5)
    fresh = [{"w": torch.randn(128, 64, generator=gen) * 0.02} for _ in range(3)]  # unrelated weights
    publish_all(store, fresh)
    snapshot_only = store.update_for(0, state_hash(bf16(fresh[0])))
    assert snapshot_only.kind == "snapshot"  # every bit changed: a patch costs more than a snapshot
    assert snapshot_only.patch is None
    assert store.update_for(2, state_hash(bf16(fresh[2]))).kind == "noop"
    store.publish(3, {"w": fresh[2]["w"] + 1e-5})  # a small step after the snapshot at 2
    small = store.update_for(2, state_hash(bf16(fresh[2])))
    assert small.kind == "patch"
    assert small.nbytes < store.update_for(None, None).nbytes


def test_receivers_follow_the_store_bit_exactly_and_pulse_equals_full():
    versions = trajectory(12)
    stores = {
        "pulse": make_store(snapshot_every=4, max_chain=3),
        "pulse-ctx": make_store("pulse-ctx", snapshot_every=4, max_chain=3),
        "full": make_store("full"),
    }
    receivers = {name: WeightReceiver() for name in stores}
    kinds = []
    for i, w in enumerate(versions):
        for name, store in stores.items():
            store.publish(i, w)
            if i % 3 == 0 or i == len(versions) - 1:  # samplers sync every few versions
                update = store.update_for(*receivers[name].held())
                kinds.append((name, update.kind))
                assert receivers[name].apply(update), receivers[name].last_error
                assert receivers[name].version == i
                assert bits_equal(receivers[name].weights, bf16(w))
        assert stores["pulse"].latest_hash == stores["full"].latest_hash
    assert bits_equal(receivers["pulse"].weights, receivers["full"].weights)
    assert bits_equal(receivers["pulse-ctx"].weights, receivers["full"].weights)
    assert {k for n, k in kinds if n == "full"} == {"snapshot"}
    assert ("pulse", "patch") in kinds
    pulse_bytes, full_bytes = (receivers[n].bytes_received for n in ("pulse", "full"))
    assert pulse_bytes < full_bytes


def test_hash_mismatch_falls_back_to_a_snapshot():
    store = make_store(snapshot_every=10)
    versions = trajectory(3)
    store.publish(0, versions[0])
    receiver = WeightReceiver()
    assert receiver.apply(store.update_for(*receiver.held()))
    bits_view(receiver.weights["layer.weight"])[0] ^= 1  # local corruption the receiver does not know about
    corrupted = {k: v.clone() for k, v in receiver.weights.items()}
    store.publish(1, versions[1])
    update = store.update_for(*receiver.held())
    assert update.kind == "patch"
    assert not receiver.apply(update)
    assert "applies to base" in receiver.last_error
    assert bits_equal(receiver.weights, corrupted)  # untouched
    assert receiver.held() == (None, None)
    assert store.update_for(0, "0" * 32).kind == "snapshot"  # a wrong hash for a known version, too
    recovery = store.update_for(*receiver.held())
    assert recovery.kind == "snapshot"
    assert receiver.apply(recovery)
    assert bits_equal(receiver.weights, bf16(versions[1]))


def test_corrupted_update_is_reported_not_raised():
    store = make_store()
    versions = trajectory(2)
    publish_all(store, versions)
    receiver = WeightReceiver(bf16(versions[0]), version=0)
    update = store.update_for(*receiver.held())
    damaged = bytearray(update.patch)
    damaged[-1] ^= 0xFF
    bad = Update(update.version, update.state_hash, update.base_version, patch=bytes(damaged))
    assert not receiver.apply(bad)
    assert "checksum" in receiver.last_error
    assert receiver.version == 0
    assert bits_equal(receiver.weights, bf16(versions[0]))


class FailingCodec(PulseCodec):
    def encode_patch(self, base, new, *, base_hash, versions, max_nbytes=None):
        raise RuntimeError("disk full")


def test_failed_publish_leaves_the_store_unchanged():
    store = WeightStore(FailingCodec(), wire_dtype=torch.bfloat16)
    versions = trajectory(2)
    store.publish(0, versions[0])  # no patch needed for the first version
    before = (store.versions, store.latest_hash, store.nbytes)
    with pytest.raises(RuntimeError, match="disk full"):
        store.publish(1, versions[1])
    assert (store.versions, store.latest_hash, store.nbytes) == before
    assert store.update_for(None, None).version == 0
    with pytest.raises(ValueError, match="not newer"):
        store.publish(0, versions[1])
    with pytest.raises(LookupError):
        make_store().update_for(None, None)


@pytest.mark.parametrize("codec", ["pulse", "pulse-ctx"])
def test_readers_never_see_a_partial_version(codec):
    store = make_store(codec, snapshot_every=3, max_chain=2, retain=4)
    versions = trajectory(15)
    store.publish(0, versions[0])
    failures: list[str] = []
    done = threading.Event()

    def reader() -> None:
        receiver = WeightReceiver()
        while not done.is_set():
            update = store.update_for(*receiver.held())
            if not receiver.apply(update):
                failures.append(receiver.last_error or "?")

    thread = threading.Thread(target=reader)
    thread.start()
    for i, w in enumerate(versions[1:], start=1):
        store.publish(i, w)
    done.set()
    thread.join()
    assert failures == []


def test_wire_dtype_casts_and_sizes_are_exposed():
    store = make_store()
    versions = trajectory(2)
    first, second = publish_all(store, versions)
    assert first.numel == second.numel == 64 * 32 + 32
    assert store.patch_nbytes(1) == second.patch_nbytes
    update = store.update_for(0, first.state_hash)
    assert update.nbytes == len(update.patch) == second.patch_nbytes
    assert store.nbytes >= first.snapshot_nbytes + second.patch_nbytes
    assert first.state_hash == state_hash(bf16(versions[0]))
    versions[1]["layer.weight"].zero_()  # the store keeps its own copy
    assert store.update_for(0, first.state_hash).state_hash == second.state_hash
    receiver = WeightReceiver()
    assert receiver.apply(store.update_for(None, None))
    assert receiver.weights["layer.weight"].dtype == torch.bfloat16
    assert np.array_equal(
        bits_view(receiver.weights["layer.weight"]), bits_view(bf16(trajectory(2)[1])["layer.weight"])
    )


def adam_trajectory(n: int, seed: int = 0, lr: float = 1e-5) -> list[dict[str, torch.Tensor]]:
    """fp32 masters after each of n steps of size lr * N(0, 1): large enough tensors for magnitude classes."""
    gen = torch.Generator().manual_seed(seed)
    w = {
        "a.weight": torch.randn(256, 128, generator=gen) * 0.02,
        "b.weight": torch.randn(128, 64, generator=gen) * 0.02,
    }
    out = []
    for _ in range(n):
        w = {k: v - lr * torch.randn(v.shape, generator=gen) for k, v in w.items()}
        out.append(w)
    return out


def test_ctx_store_serves_v2_patches_and_v2_merges_smaller_than_pulse():
    versions = adam_trajectory(6)
    stores = {name: make_store(name, snapshot_every=100, max_chain=8) for name in ("pulse", "pulse-ctx")}
    sizes: dict[str, list[int]] = {name: [] for name in stores}
    for name, store in stores.items():
        publish_all(store, versions)
        for held in (4, 1):  # one behind: the latest patch; four behind: a merge
            update = store.update_for(held, state_hash(bf16(versions[held])))
            assert update.kind == "patch"
            assert patch_info(update.patch).format_version == (2 if name == "pulse-ctx" else 1)
            receiver = WeightReceiver(bf16(versions[held]), version=held)
            assert receiver.apply(update), receiver.last_error
            assert bits_equal(receiver.weights, bf16(versions[-1]))
            sizes[name].append(update.nbytes)
        assert store.patch_nbytes(5) == sizes[name][0]
    assert all(ctx < 0.9 * plain for ctx, plain in zip(sizes["pulse-ctx"], sizes["pulse"], strict=True))


class SlowMergeCodec(PulseCtxCodec):
    """Blocks inside merge until released, so publishes can happen while it re-codes against the latest copy."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def merge(self, records, latest):
        self.entered.set()
        assert self.release.wait(30)
        return super().merge(records, latest)


def test_a_merge_keeps_its_weights_copy_while_publishes_go_on():
    codec = SlowMergeCodec()
    store = WeightStore(codec, wire_dtype=torch.bfloat16, snapshot_every=100)
    versions = adam_trajectory(6)
    publish_all(store, versions[:4])
    result: list[Update] = []
    thread = threading.Thread(target=lambda: result.append(store.update_for(0, state_hash(bf16(versions[0])))))
    thread.start()
    assert codec.entered.wait(30)
    store.publish(4, versions[4])  # the spare buffer is the one before the merge's; fine either way
    store.publish(5, versions[5])  # would overwrite the copy the merge reads, were it not pinned
    codec.release.set()
    thread.join()
    receiver = WeightReceiver(bf16(versions[0]), version=0)
    assert receiver.apply(result[0]), receiver.last_error
    assert receiver.version == 3
    assert bits_equal(receiver.weights, bf16(versions[3]))


def _resigned(blob: bytes, **fields) -> bytes:
    parsed = unpack(blob)
    return pack({**parsed.header, **fields}, [bytes(parsed.payload)], parsed.version)


@pytest.mark.parametrize("codec", ["pulse", "pulse-ctx"])
def test_a_refused_update_never_touches_the_weights(codec):
    """Issue 15, item 8: blobs whose own versions or hashes disagree with the update are refused before any
    write, including a snapshot that is fine followed by a patch that is not."""
    store = make_store(codec, snapshot_every=2)
    versions = trajectory(4)
    publish_all(store, versions)
    start = bf16(versions[0])
    cases = {}
    good = store.update_for(None, None)
    assert good.kind == "snapshot"
    assert good.patch is not None  # snapshot 2 + patch 2 -> 3
    cases["patch result_version"] = Update(
        3, good.state_hash, 2, good.snapshot, _resigned(good.patch, result_version=4)
    )
    cases["patch base_hash"] = Update(3, good.state_hash, 2, good.snapshot, _resigned(good.patch, base_hash="0" * 32))
    cases["promised version"] = Update(7, good.state_hash, 2, good.snapshot, good.patch)
    cases["snapshot as patch"] = Update(3, good.state_hash, 2, None, good.snapshot)
    cases["patch as snapshot"] = Update(3, good.state_hash, 2, good.patch, None)
    cases["noop, not held"] = Update(3, good.state_hash, 3)
    one_step = store.update_for(2, state_hash(bf16(versions[2])))
    cases["patch for another base"] = one_step
    receiver = WeightReceiver(start, version=0)
    for name, update in cases.items():
        receiver.needs_snapshot = False
        assert not receiver.apply(update), name
        assert bits_equal(receiver.weights, bf16(versions[0])), name
        assert receiver.version == 0, name
    assert receiver.refused == len(cases)
    assert receiver.apply(good)
    assert (receiver.applied, receiver.version) == (1, 3)
    assert bits_equal(receiver.weights, bf16(versions[3]))


@pytest.mark.parametrize("codec", ["pulse", "pulse-ctx"])
def test_dense_steps_go_as_snapshots_without_coding_a_patch(codec):
    """A version whose patch is estimated (from the diff's change counts) above patch_max_ratio x the last snapshot
    is published as a snapshot, no patch coded; receivers still end bit-exact, sparse steps still get patches."""

    store = WeightStore(make_codec(codec), wire_dtype=torch.bfloat16, snapshot_every=100, patch_max_ratio=0.5)
    gen = torch.Generator().manual_seed(0)
    v0 = {"w": torch.randn(256, 300, generator=gen) * 0.02, "b": torch.randn(300, generator=gen) * 0.02}
    dense = {k: v + 0.01 * torch.randn(v.shape, generator=gen) for k, v in v0.items()}  # every element moves
    sparse = {k: v.clone() for k, v in dense.items()}
    sparse["w"][0, :10] += 0.5
    receiver = WeightReceiver()
    for version, weights in enumerate([v0, dense, sparse]):
        published = store.publish(version, weights)
        assert receiver.apply(store.update_for(*receiver.held()))
        want = {k: v.bfloat16() for k, v in weights.items()}
        assert all(np.array_equal(bits_view(receiver.weights[k]), bits_view(want[k])) for k in want)
        if version == 1:
            assert published.patch_skipped
            assert published.patch_nbytes is None
            assert published.snapshot_nbytes
            assert published.changed > 0.9 * published.numel
        if version == 2:
            assert not published.patch_skipped
            assert published.patch_nbytes
            assert published.snapshot_nbytes is None
