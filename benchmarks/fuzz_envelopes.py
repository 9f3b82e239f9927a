"""Fuzz the sampler's weight intake with mutated update envelopes, through the code a live sampler runs
(`SamplerNode._receive`: `decode_update`, then `SamplerWorker.receive`, then `WeightReceiver.apply`).

A store publishes versions of a small model's bf16 weights (sparse changes, like training); every trial takes a
receiver holding some version, a genuine envelope (snapshot, patch, merged patch, snapshot + patch) and one
mutation, hands the bytes to the sampler and checks the outcome:

- an exception out of `_receive` is an *unexpected exception*;
- an update reported applied must leave the receiver holding exactly the weights the store published under the
  hash it now claims (else *silently wrong weights*); a version number other than the one published with that
  hash is counted apart (*forged version label*: the weights are right, only their label is not, which a blob
  whose header and checksum were rewritten consistently can do, and only a signature could prevent);
- an update refused must leave every weight bit for bit as it was (else *changed after a refusal*) and ask for
  a snapshot next.

Mutation families: bit flips, byte overwrites, truncation and padding, header fields rewritten (versions,
hashes, kinds, sizes; re-framed so the framing is valid), blobs swapped between envelopes, hostile header JSON
(deep nesting, huge integers, NaN), blobs replaced by checksummed blobs with hostile headers, and blob headers
rewritten with a recomputed checksum (what a buggy or hostile learner can send; the receiver's own checks).

    python benchmarks/fuzz_envelopes.py --trials 10000 --seed 0
"""

from __future__ import annotations

import argparse
import io
import json
import random
import struct
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import xxhash
import zstandard as zstd

from heterorl.config import ModelConfig, load_config
from heterorl.eventlog import EventLog
from heterorl.framing import frame, unframe
from heterorl.loop.session import SamplerSession
from heterorl.loop.worker import SamplerWorker
from heterorl.node.sampler import SamplerNode
from heterorl.policy import Policy
from heterorl.run.build import build_sampler
from heterorl.simulated.events import EventLoop
from heterorl.simulated.runtime import VirtualRuntime
from heterorl.weights import WeightReceiver, WeightStore, state_hash
from heterorl.weights.envelope import MAGIC, EnvelopeError, encode_update
from heterorl.weights.format import MAGIC as BLOB_MAGIC
from heterorl.weights.format import PREFIX

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
VERSIONS = 6


@dataclass
class Figures:
    trials: int = 0
    applied: int = 0
    refused: int = 0
    unexpected: Counter[str] = field(default_factory=Counter)
    wrong_weights: Counter[str] = field(default_factory=Counter)
    forged_label: Counter[str] = field(default_factory=Counter)
    changed_after_refusal: Counter[str] = field(default_factory=Counter)
    by_family: Counter[str] = field(default_factory=Counter)
    applied_by_family: Counter[str] = field(default_factory=Counter)


def build(seed: int, workdir: Path) -> tuple[SamplerNode, WeightStore, dict[int, dict[str, torch.Tensor]]]:
    """A sampler (tiny model) and a store holding VERSIONS versions of sparsely changing bf16 weights."""
    Policy.from_config(ModelConfig(**TINY), seed=0).save(workdir / "model")
    overrides = [f"model.path={workdir / 'model'}", "weights.codec=pulse", "weights.snapshot_every=4"]
    cfg = load_config(None, overrides)
    worker = SamplerWorker(cfg, 0, build_sampler(cfg, 0, base=str(workdir / "model")))
    session = SamplerSession(cfg, 0, worker.name, "fuzz")
    runtime = VirtualRuntime(EventLoop(), 1.0, "fuzz")
    events = EventLog(io.StringIO())
    sampler = SamplerNode(session, worker, None, runtime, 1.0, emit=events.emit)  # type: ignore[arg-type]
    store = WeightStore.from_config(cfg.weights)
    gen = torch.Generator().manual_seed(seed)
    weights = {
        k: v.detach().to(torch.bfloat16).clone() for k, v in worker.sampler.engine.policy.model.state_dict().items()
    }
    history = {}
    for version in range(VERSIONS):
        if version:
            for t in weights.values():  # a sparse change, as one small optimizer step makes
                flat = t.view(-1)
                idx = torch.randint(0, flat.numel(), (max(1, flat.numel() // 50),), generator=gen)
                flat[idx] = (flat[idx].float() + torch.randn(idx.shape, generator=gen) * 0.01).to(torch.bfloat16)
        store.publish(version, weights)
        history[version] = {k: v.clone() for k, v in weights.items()}
    return sampler, store, history


def genuine(store: WeightStore, history: dict[int, dict[str, torch.Tensor]], held: int | None) -> bytes:
    hashes = {v: state_hash(w) for v, w in history.items()}
    update = store.update_for(held, hashes[held] if held is not None else None)
    return encode_update(update)


# ---------------------------------------------------------------- mutations
def _header(data: bytes) -> tuple[dict, bytes]:
    header, start = unframe(data, MAGIC, 1 << 20, EnvelopeError)
    return header, data[start:]


def _reblob(header_json: bytes, payload: bytes = b"") -> bytes:
    head = zstd.ZstdCompressor().compress(header_json)
    return PREFIX.pack(BLOB_MAGIC, 1, len(head), len(payload), xxhash.xxh3_128_digest(head + payload)) + head + payload


def _blob_parts(blob: bytes) -> tuple[dict, bytes]:
    _, _, header_len, _, _ = PREFIX.unpack_from(blob)
    head = zstd.ZstdDecompressor().decompress(blob[PREFIX.size : PREFIX.size + header_len])
    return json.loads(head), blob[PREFIX.size + header_len :]


def flip_bits(rng: random.Random, data: bytes, **_: object) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def overwrite(rng: random.Random, data: bytes, **_: object) -> bytes:
    out = bytearray(data)
    start = rng.randrange(len(out))
    n = rng.randint(1, 64)
    out[start : start + n] = rng.randbytes(min(n, len(out) - start))
    return bytes(out)


def truncate_or_pad(rng: random.Random, data: bytes, **_: object) -> bytes:
    if rng.random() < 0.5:
        return data[: rng.randrange(len(data))]
    return data + rng.randbytes(rng.randint(1, 100))


def rewrite_header(rng: random.Random, data: bytes, hashes: dict[int, str], **_: object) -> bytes:
    header, body = _header(data)
    key = rng.choice(["version", "state_hash", "base_version", "kind", "snapshot_nbytes", "patch_nbytes"])
    choices = {
        "version": [header["version"] + rng.choice([-1, 1, 2]), 0, -1, 2**40, "1", None, 1.5, True],
        "state_hash": [*hashes.values(), "0" * 32, "zz", "", 7],
        "base_version": [None, 0, 1, 2, 3, 4, 5, -3, "x"],
        "kind": ["snapshot", "patch", "noop", "", None, 3],
        "snapshot_nbytes": [0, 1, header["snapshot_nbytes"] + 1, header["snapshot_nbytes"] - 1, -1, 2**40],
        "patch_nbytes": [0, 1, header["patch_nbytes"] + 1, header["patch_nbytes"] - 1, -1, 2**40],
    }
    header[key] = rng.choice(choices[key])
    if rng.random() < 0.5 and isinstance(header.get("version"), int):  # keep the version and hash consistent
        v = header["version"]
        header["state_hash"] = hashes.get(v, header.get("state_hash"))
    return frame(MAGIC, header, body)


def swap_blobs(rng: random.Random, data: bytes, others: list[bytes], **_: object) -> bytes:
    header, _ = _header(data)
    other_header, other_body = _header(rng.choice(others))
    mixed = dict(header) if rng.random() < 0.5 else dict(other_header)
    mixed["snapshot_nbytes"], mixed["patch_nbytes"] = other_header["snapshot_nbytes"], other_header["patch_nbytes"]
    return frame(MAGIC, mixed, other_body)


def hostile_json(rng: random.Random, data: bytes, **_: object) -> bytes:
    text = rng.choice(
        [
            b"[" * 2000 + b"]" * 2000,
            b'{"version": ' + b"9" * 3000 + b"}",
            b'{"version": NaN, "state_hash": "ab"}',
            b'{"version": 1e999}',
            b'{"kind": {"kind": {"kind": {"kind": {"kind": {"kind": {"kind": {"kind": {"kind": 1}}}}}}}}}',
            b"\xff\xfe\x00{",
        ]
    )
    return struct.pack("<8sI", MAGIC, len(text)) + text + data[12 + struct.unpack_from("<I", data, 8)[0] :]


def hostile_blob(rng: random.Random, data: bytes, **_: object) -> bytes:
    header, body = _header(data)
    head = rng.choice(
        [
            b"[" * 50_000 + b"]" * 50_000,
            b'{"kind": "snapshot", "result_version": ' + b"7" * 5000 + b"}",
            b'{"kind": "patch", "result_hash": NaN}',
            b'{"kind": "snapshot", "tensors": [{"name": "x", "shape": [' + b"9" * 40 + b"]}]}",
            b'{"kind": "snapshot", "tensors": "not a list", "result_hash": "ab"}',
            b"[1, 2, 3]",
        ]
    )
    blob = _reblob(head)
    n_snap = header["snapshot_nbytes"]
    if n_snap:  # the snapshot goes, the patch (if any) stays
        return frame(MAGIC, {**header, "snapshot_nbytes": len(blob)}, blob + body[n_snap:])
    return frame(MAGIC, {**header, "patch_nbytes": len(blob)}, blob)


def resign_blob(rng: random.Random, data: bytes, hashes: dict[int, str], **_: object) -> bytes:
    """Rewrite one field of a blob's header and recompute its checksum (and the envelope to match)."""
    header, body = _header(data)
    n_snap = header["snapshot_nbytes"]
    parts = [("snapshot", body[:n_snap])] if n_snap else []
    if header["patch_nbytes"]:
        parts.append(("patch", body[n_snap:]))
    index = rng.randrange(len(parts))
    kind, blob = parts[index]
    blob_header, payload = _blob_parts(blob)
    key = rng.choice(["result_version", "result_hash", "base_hash", "base_version", "tensors"])
    if key == "tensors" and blob_header.get("tensors"):
        entry = rng.choice(blob_header["tensors"])
        field_name = rng.choice(sorted(entry))
        value = entry[field_name]
        entry[field_name] = (value + rng.choice([-1, 1])) if isinstance(value, int) else rng.choice([None, "x", [1]])
    elif key in ("result_hash", "base_hash"):
        blob_header[key] = rng.choice([*hashes.values(), "0" * 32])
    else:
        blob_header[key] = rng.choice([0, 1, 2, 3, 4, 5, 6, None])
    parts[index] = (kind, _reblob(json.dumps(blob_header).encode(), bytes(payload)))
    new_body = b"".join(b for _, b in parts)
    sizes = {f"{k}_nbytes": len(b) for k, b in parts}
    last_header, _ = _blob_parts(parts[-1][1])
    if rng.random() < 0.7:  # an envelope that agrees with its (tampered) blobs
        header["version"] = last_header.get("result_version", header["version"])
        header["state_hash"] = last_header.get("result_hash", header["state_hash"])
        if not n_snap and parts[0][0] == "patch":
            header["base_version"] = last_header.get("base_version", header["base_version"])
    return frame(MAGIC, {**header, "snapshot_nbytes": 0, "patch_nbytes": 0, **sizes}, new_body)


FAMILIES: dict[str, Callable[..., bytes]] = {
    "bit flips": flip_bits,
    "byte overwrite": overwrite,
    "truncate / pad": truncate_or_pad,
    "header field rewritten": rewrite_header,
    "blobs swapped": swap_blobs,
    "hostile header JSON": hostile_json,
    "checksummed hostile blob": hostile_blob,
    "blob header re-signed": resign_blob,
}


# ---------------------------------------------------------------- the harness
def run(trials: int, seed: int, workdir: Path) -> Figures:
    rng = random.Random(seed)
    sampler, store, history = build(seed, workdir)
    worker = sampler.worker
    hashes = {v: state_hash(w) for v, w in history.items()}
    by_hash = {h: v for v, h in hashes.items()}
    cases = [(held, genuine(store, history, held)) for held in [None, *range(VERSIONS - 1)]]
    envelopes = [data for _, data in cases]
    figures = Figures()
    names = sorted(FAMILIES)
    for trial in range(trials):
        family = names[trial % len(names)]
        held, data = rng.choice(cases)
        start = rng.choice(range(VERSIONS)) if held is None else held  # a receiver with a snapshot may hold any
        worker.receiver = WeightReceiver({k: v.clone() for k, v in history[start].items()}, version=start)
        worker.failed, worker.ignored, worker.applied = 0, 0, 0
        try:
            mutated = FAMILIES[family](rng, data, hashes=hashes, others=envelopes)
        except (EnvelopeError, KeyError, ValueError, IndexError):  # the mutation does not apply to this envelope
            mutated = flip_bits(rng, data)
        before = {k: v.clone() for k, v in worker.receiver.weights.items()}
        figures.trials += 1
        figures.by_family[family] += 1
        try:
            ok = sampler._receive(mutated)
        except Exception as exc:
            figures.unexpected[f"{family}: {type(exc).__name__}"] += 1
            continue
        receiver = worker.receiver
        if ok:
            figures.applied += 1
            figures.applied_by_family[family] += 1
            published = by_hash.get(receiver.state_hash)
            right = published is not None and all(
                torch.equal(receiver.weights[k], history[published][k]) for k in history[published]
            )
            if not right:
                figures.wrong_weights[family] += 1
            elif receiver.version != published:
                figures.forged_label[family] += 1
        else:
            figures.refused += 1
            unchanged = all(torch.equal(receiver.weights[k], before[k]) for k in before)
            if not unchanged:
                figures.changed_after_refusal[family] += 1
    return figures


def report(figures: Figures, seconds: float) -> str:
    lines = [
        f"{figures.trials} mutated envelopes in {seconds:.1f} s: {figures.applied} applied, {figures.refused} refused",
        f"unexpected exceptions: {figures.unexpected.total()} {dict(figures.unexpected) or ''}",
        f"silently wrong weights: {figures.wrong_weights.total()} {dict(figures.wrong_weights) or ''}",
        f"weights changed after a refusal: {figures.changed_after_refusal.total()} "
        f"{dict(figures.changed_after_refusal) or ''}",
        f"forged version labels (right weights): {figures.forged_label.total()} {dict(figures.forged_label) or ''}",
        "per family (trials / applied): "
        + ", ".join(f"{k} {figures.by_family[k]}/{figures.applied_by_family[k]}" for k in sorted(figures.by_family)),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        figures = run(args.trials, args.seed, Path(tmp))
    print(report(figures, time.monotonic() - began))
    bad = figures.unexpected.total() + figures.wrong_weights.total() + figures.changed_after_refusal.total()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
