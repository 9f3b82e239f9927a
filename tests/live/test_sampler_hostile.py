"""A sampler fed hostile weight bytes refuses them: no exception leaves `_receive` / `SamplerWorker.receive`, the
weights it holds stay as they were, and it asks for a snapshot next."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import pytest
import torch
import xxhash
import zstandard as zstd

from conftest import tiny_config
from heterorl.eventlog import EventLog
from heterorl.framing import frame
from heterorl.loop.session import SamplerSession
from heterorl.loop.worker import SamplerWorker
from heterorl.node.sampler import SamplerNode
from heterorl.run.build import build_sampler
from heterorl.simulated.events import EventLoop
from heterorl.simulated.runtime import VirtualRuntime
from heterorl.weights import Update, WeightStore
from heterorl.weights.envelope import MAGIC, encode_update
from heterorl.weights.format import MAGIC as BLOB_MAGIC
from heterorl.weights.format import PREFIX


def raw_blob(header_json: bytes, payload: bytes = b"") -> bytes:
    """A weight blob with a valid checksum around any header text (what a buggy or hostile learner could send)."""
    head = zstd.ZstdCompressor().compress(header_json)
    checksum = xxhash.xxh3_128_digest(head + payload)
    return PREFIX.pack(BLOB_MAGIC, 1, len(head), len(payload), checksum) + head + payload


def envelope(header: dict, snapshot: bytes = b"", patch: bytes = b"") -> bytes:
    sizes = {"snapshot_nbytes": len(snapshot), "patch_nbytes": len(patch)}
    return frame(MAGIC, {**header, **sizes}, snapshot + patch)


DEEP = b"[" * 50_000 + b"]" * 50_000
HUGE_INT = b'{"kind": "snapshot", "result_version": ' + b"7" * 5000 + b"}"
SNAPSHOT_HEAD = {"version": 1, "state_hash": "ab" * 16, "base_version": None, "kind": "snapshot"}
HOSTILE = {
    "envelope header nested 2,000 deep": struct.pack("<8sI", MAGIC, 4000) + b"[" * 2000 + b"]" * 2000,
    "envelope header with a 4000-digit version": envelope({**SNAPSHOT_HEAD, "version": 10**3999}, raw_blob(b"{}")),
    "snapshot blob whose header is nested 50,000 deep": envelope(SNAPSHOT_HEAD, raw_blob(DEEP)),
    "snapshot blob with a 5000-digit integer": envelope(SNAPSHOT_HEAD, raw_blob(HUGE_INT)),
    "snapshot blob whose header is not JSON": envelope(SNAPSHOT_HEAD, raw_blob(b"\xff\xfe{")),
    "snapshot blob with NaN": envelope(SNAPSHOT_HEAD, raw_blob(b'{"kind": "snapshot", "result_hash": NaN}')),
    "patch blob with a list for a header": envelope({**SNAPSHOT_HEAD, "kind": "patch"}, b"", raw_blob(b"[1, 2]")),
    "random bytes": bytes(range(256)) * 3,
}


@pytest.fixture
def sampler(tiny_model_dir: Path) -> SamplerNode:
    cfg = tiny_config(tiny_model_dir, "weights.codec=pulse")
    worker = SamplerWorker(cfg, 0, build_sampler(cfg, 0, base=str(tiny_model_dir)))
    events = EventLog(io.StringIO())
    session = SamplerSession(cfg, 0, worker.name, "b")
    runtime = VirtualRuntime(EventLoop(), 1.0, "test")
    node = SamplerNode(session, worker, transport=None, runtime=runtime, poll_seconds=1.0, emit=events.emit)  # type: ignore[arg-type]
    node.events = events  # type: ignore[attr-defined]
    store = WeightStore.from_config(cfg.weights)
    store.publish(0, worker.sampler.engine.policy.model.state_dict())
    assert node._receive(encode_update(store.update_for(None, None)))
    return node


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_weight_bytes_are_refused_without_an_exception(sampler: SamplerNode, name: str) -> None:
    worker = sampler.worker
    before = {k: v.clone() for k, v in (worker.receiver.weights or {}).items()}
    held = worker.held()
    assert held[0] == 0
    assert sampler._receive(HOSTILE[name]) is False
    assert worker.failed == 1
    assert worker.held() == (None, None)  # the next pull asks for a snapshot
    assert worker.receiver.version == 0  # and it still knows what it holds
    for key, value in (worker.receiver.weights or {}).items():
        assert torch.equal(value, before[key]), key
    events = [json.loads(line) for line in sampler.events.stream.getvalue().splitlines()]  # type: ignore[union-attr]
    assert events[-1]["event"] == "weights"
    assert events[-1]["ok"] is False


def test_worker_receive_turns_a_parse_error_into_a_refusal(sampler: SamplerNode) -> None:
    """Whatever the receiver's parser raises on hostile bytes (here a blob header nested 50,000 deep handed to
    `WeightReceiver.apply` directly, past the envelope's checks) is a refusal, not a crash of the sampler."""
    worker = sampler.worker
    update = Update(version=1, state_hash="ab" * 16, base_version=0, patch=raw_blob(DEEP))
    assert worker.receive(update) is False
    assert worker.failed == 1
    assert worker.held() == (None, None)
