"""Durable learner state: everything a killed learner needs to continue at the same version.

A state directory holds

    trainable.safetensors     the fp32 trainable weights by parameter name: every weight, or with LoRA the adapters
    optimizer.safetensors     AdamW's per-parameter tensors, named `state.<param index>.<key>`
    rng.safetensors           torch CPU (and CUDA) generator states
    queue.records             accepted, not yet trained rollout groups (`encode_group` messages, framed)
    state.json                version, optimizer param groups, scheduler, python/numpy RNG, queue count, and the
                              driver's own bookkeeping (`extra`)

A learner is restored by building it from the run's base model, exactly as it was first built (so the frozen
parts, LoRA's base weights, and the KL reference are the base model's), then loading the trainable weights: a
merged checkpoint would give a LoRA learner fresh adapters on a different base, which samplers holding the base
cannot use, and would make the resumed weights the KL reference.

No pickle anywhere (safetensors + JSON), so a state directory is safe to copy between hosts. States are written
into a temporary directory, fsynced and renamed into place as `s<seq>-v<version>`: a directory with that name is
complete by construction, the newest sequence number wins, and older states are deleted only afterwards, so a
kill at any instant leaves at least one complete state.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from heterorl import failpoints
from heterorl.durable.journal import frame, fsync_path, parse_records
from heterorl.learner import Learner

STATE_FORMAT = 2  # 2: trainable.safetensors (1 held a merged transformers checkpoint, wrong with LoRA)


@dataclass(frozen=True)
class SavedState:
    """What `restore_learner_state` hands back besides the learner it restored."""

    path: Path
    version: int
    queue: list[bytes]  # encoded groups, oldest first
    extra: dict[str, Any]


# ---------------------------------------------------------------- the queue (journal framing)
def write_records(path: Path, payloads: list[bytes]) -> None:
    """Length- and checksum-framed payloads, back to back (the journal's record format)."""
    path.write_bytes(b"".join(frame(p) for p in payloads))


def read_records(path: Path, count: int) -> list[bytes]:
    """Exactly `count` intact records filling the file; anything else is an error (a state must be complete)."""
    data = path.read_bytes()
    records, end = parse_records(data)
    if end != len(data) or len(records) != count:
        raise ValueError(f"{path}: {len(records)} intact records in {end} of {len(data)} bytes, expected {count}")
    return records


# ---------------------------------------------------------------- optimizer, scheduler, RNG
def _optimizer_parts(learner: Learner) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = learner.optimizer_state_dict()  # the full state also when sharded over ranks
    tensors, scalars = {}, {}
    for index, entries in sd["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{index}.{key}"] = value
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _load_optimizer(learner: Learner, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = value
    for name, value in meta["scalars"].items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["param_groups"]]
    learner.optimizer.load_state_dict({"state": state, "param_groups": groups})


def _rng_parts() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = s
    py = random.getstate()
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    meta = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
    }
    return tensors, meta


def _load_rng(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[f"cuda.{i}"] for i in range(sum(k.startswith("cuda.") for k in tensors))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    version, keys, gauss = meta["python"]
    random.setstate((version, tuple(keys), gauss))
    kind, np_keys, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((kind, np.asarray(np_keys, dtype=np.uint32), pos, has_gauss, cached))


# ---------------------------------------------------------------- save / find / restore
def _state_dirs(root: Path) -> list[tuple[int, Path]]:
    out = []
    if root.is_dir():
        for p in root.iterdir():
            seq, _, version = p.name.partition("-v")
            if p.is_dir() and seq.startswith("s") and seq[1:].isdigit() and version.isdigit():
                out.append((int(seq[1:]), p))
    return sorted(out)


# ---------------------------------------------------------------- the served-version mark
_MARK_DIGITS = 12


def write_version_mark(path: Path, version: int, fsync: bool = True) -> None:
    """Record durably that `version` may have reached samplers (before it is served). Fixed width and written in
    place, so it needs no new disk block (it works on a full disk) and one write never tears a number apart."""
    data = f"{version:0{_MARK_DIGITS}d}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_version_mark(path: Path) -> int:
    """The version recorded by `write_version_mark`, or -1 (none, or unreadable)."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return -1
    return int(text) if text.isdigit() and len(text) == _MARK_DIGITS else -1


def remove_stale_temporaries(root: str | Path) -> list[Path]:
    """Delete the `.tmp-*` directories a learner killed mid-save left under `root` (call only while no other
    process writes there: the learner holds the run directory's lock); returns what was removed."""
    root = Path(root)
    stale = sorted(p for p in root.glob(".tmp-*") if p.is_dir()) if root.is_dir() else []
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


def latest_state(root: str | Path) -> Path | None:
    """The newest complete state directory under `root`, or None."""
    dirs = _state_dirs(Path(root))
    return dirs[-1][1] if dirs else None


def save_learner_state(learner: Learner, root: str | Path, *, queue: list[bytes], extra: dict[str, Any]) -> Path:
    """Write the learner's full state (plus `queue` and `extra`) atomically under `root`; returns its path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    existing = _state_dirs(root)
    seq = existing[-1][0] + 1 if existing else 0
    final = root / f"s{seq:08d}-v{learner.version:08d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_state(learner, tmp, queue, extra)
    except OSError:  # disk full: leave nothing half-written behind; the previous state is intact
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    failpoints.hit("state.written")  # complete, not yet renamed into place
    tmp.rename(final)
    fsync_path(root)
    failpoints.hit("state.renamed")  # two states on disk, the journal not pruned yet
    for _, old in existing:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write_state(learner: Learner, tmp: Path, queue: list[bytes], extra: dict[str, Any]) -> None:
    tmp.mkdir()
    save_file(_trainable(learner), str(tmp / "trainable.safetensors"))
    opt_tensors, opt_meta = _optimizer_parts(learner)
    save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
    rng_tensors, rng_meta = _rng_parts()
    save_file(rng_tensors, str(tmp / "rng.safetensors"))
    write_records(tmp / "queue.records", queue)
    meta = {
        "format": STATE_FORMAT,
        "version": learner.version,
        "optimizer": opt_meta,
        "scheduler": learner.scheduler.state_dict(),
        "rng": rng_meta,
        "queue_count": len(queue),
        "extra": extra,
    }
    (tmp / "state.json").write_text(json.dumps(meta))
    _fsync_tree(tmp)


def _trainable(learner: Learner) -> dict[str, torch.Tensor]:
    model = learner.policy.model
    return {name: p.detach().cpu().contiguous() for name, p in model.named_parameters() if p.requires_grad}


def _load_trainable(learner: Learner, tensors: dict[str, torch.Tensor], path: Path) -> None:
    params = {name: p for name, p in learner.policy.model.named_parameters() if p.requires_grad}
    if set(params) != set(tensors):
        missing, extra = sorted(set(params) - set(tensors))[:3], sorted(set(tensors) - set(params))[:3]
        raise ValueError(f"{path}: trainable weights do not match this model (missing {missing}, extra {extra})")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(tensors[name])


def restore_learner_state(learner: Learner, path: str | Path) -> SavedState:
    """Load trainable weights, optimizer, scheduler, version and RNG states into `learner`, which must be built
    from the run's base model (`build_learner(cfg, base)`)."""
    path = Path(path)
    meta = json.loads((path / "state.json").read_text())
    if meta.get("format") != STATE_FORMAT:
        raise ValueError(f"{path}: state format {meta.get('format')!r}, this version reads {STATE_FORMAT}")
    _load_trainable(learner, load_file(str(path / "trainable.safetensors")), path)
    _load_optimizer(learner, load_file(str(path / "optimizer.safetensors")), meta["optimizer"])
    learner.scheduler.load_state_dict(meta["scheduler"])
    learner.version = int(meta["version"])
    _load_rng(load_file(str(path / "rng.safetensors")), meta["rng"])
    queue = read_records(path / "queue.records", int(meta["queue_count"]))
    return SavedState(path=path, version=learner.version, queue=queue, extra=meta["extra"])


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory below `root` (so the rename publishes data that is on disk)."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fsync_path(Path(dirpath) / name)
        fsync_path(Path(dirpath))
