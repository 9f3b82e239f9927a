"""Sync codecs behind one small interface, chosen by name (`WeightsConfig.codec`).

* "full": every version travels as a snapshot; the baseline that PULSE is measured against.
* "pulse": every version also gets a lossless sparse patch from its predecessor; receivers that hold a recent
  version get a (merged) patch, others a snapshot.

Adding a codec is one subclass and one registry line; the store only calls these three methods.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from heterorl.weights.format import StateDict
from heterorl.weights.patch import encode_patch, merge_patches
from heterorl.weights.snapshot import encode_snapshot


class SyncCodec(ABC):
    """Turns published versions into bytes for receivers."""

    name: ClassVar[str]

    def __init__(self, *, level: int = 1, workers: int = 1) -> None:
        self.level = level
        self.workers = workers

    def encode_snapshot(self, weights: StateDict, *, state_hash: str | None, version: int | None) -> bytes:
        """Everything a receiver with no usable weights needs."""
        return encode_snapshot(weights, level=self.level, state_hash=state_hash, version=version, workers=self.workers)

    @abstractmethod
    def encode_patch(
        self, base: StateDict, new: StateDict, *, base_hash: str, versions: tuple[int, int]
    ) -> bytes | None:
        """Bytes taking a receiver from `base` to `new`, or None if this codec only sends snapshots."""

    @abstractmethod
    def merge(self, patches: Sequence[bytes]) -> bytes:
        """One patch equivalent to applying `patches` in order."""


class FullCodec(SyncCodec):
    """Snapshot every version; no patches."""

    name = "full"

    def encode_patch(
        self, base: StateDict, new: StateDict, *, base_hash: str, versions: tuple[int, int]
    ) -> bytes | None:
        return None

    def merge(self, patches: Sequence[bytes]) -> bytes:
        raise NotImplementedError("the full codec has no patches to merge")


class PulseCodec(SyncCodec):
    """Lossless sparse patches (PULSE) between consecutive versions, merged for receivers further behind."""

    name = "pulse"

    def encode_patch(
        self, base: StateDict, new: StateDict, *, base_hash: str, versions: tuple[int, int]
    ) -> bytes | None:
        return encode_patch(
            base,
            new,
            level=self.level,
            base_hash=base_hash,
            base_version=versions[0],
            new_version=versions[1],
            workers=self.workers,
        )

    def merge(self, patches: Sequence[bytes]) -> bytes:
        return merge_patches(patches, level=self.level)


CODECS: dict[str, type[SyncCodec]] = {codec.name: codec for codec in (FullCodec, PulseCodec)}


def make_codec(name: str, *, level: int = 1, workers: int = 1) -> SyncCodec:
    """Codec by registry name; ValueError naming the choices for an unknown one."""
    try:
        return CODECS[name](level=level, workers=workers)
    except KeyError:
        raise ValueError(f"unknown weight-sync codec {name!r} (choices: {sorted(CODECS)})") from None
