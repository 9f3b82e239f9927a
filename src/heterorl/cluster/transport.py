"""The one interface weights travel through: the learner publishes versions, a sampler receives messages.

A `WeightPublisher` lives with the learner: `publish(version, weights)` and `message(held_version)` (the update
that brings a receiver holding `held_version` to the newest version). A `WeightReceiver` lives with a sampler:
`apply(message)` and the weights it now holds. Messages are bytes plus a small envelope, so the same objects
cross a simulated link (charged `nbytes`) or a real socket. `make_publisher` picks the codec from the config:
full snapshots (safetensors bytes) or PULSE sparse patches.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from heterorl.config import WeightsConfig


@dataclass(frozen=True)
class WeightMessage:
    """One weight update on the wire: `payload` brings a receiver at `base_version` (None: any) to `version`."""

    version: int
    base_version: int | None
    kind: str  # "snapshot" | "patch"
    payload: bytes
    full_bytes: int  # what a full wire-dtype snapshot of the same version costs, for comparison
    changed_share: float = 1.0  # share of weight elements whose bits the message rewrites

    @property
    def nbytes(self) -> int:
        return len(self.payload)


def state_nbytes(weights: dict[str, torch.Tensor]) -> int:
    """Raw byte size of a state dict."""
    return sum(t.numel() * t.element_size() for t in weights.values())


class WeightPublisher(ABC):
    """Learner side: holds published versions and builds the message a receiver needs."""

    def __init__(self, cfg: WeightsConfig) -> None:
        self.cfg = cfg
        self.version: int | None = None

    @abstractmethod
    def publish(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Make `version` (wire-dtype tensors, not modified afterwards by the caller) the newest."""

    @abstractmethod
    def message(self, held_version: int | None) -> WeightMessage:
        """The update that brings a receiver holding `held_version` (None: nothing) to the newest version."""


class SnapshotPublisher(WeightPublisher):
    """Always sends the whole state dict as safetensors bytes (the full-weight baseline)."""

    def publish(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        self._payload = save_safetensors({k: v.contiguous() for k, v in weights.items()})
        self._full = state_nbytes(weights)
        self.version = version

    def message(self, held_version: int | None) -> WeightMessage:
        if self.version is None:
            raise RuntimeError("nothing published yet")
        return WeightMessage(self.version, None, "snapshot", self._payload, self._full)


class WeightReceiver:
    """Sampler side: the weights it holds, their version, and how messages update them."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.weights: dict[str, torch.Tensor] = {}

    def apply(self, msg: WeightMessage) -> None:
        """Apply a message; snapshots replace everything, patches are validated against the held base."""
        if msg.kind == "snapshot":
            self.weights = load_safetensors(msg.payload)
        elif msg.kind == "patch":
            from heterorl.weights import apply_patch

            if msg.base_version != self.version:
                raise ValueError(f"patch for base {msg.base_version} offered to receiver at {self.version}")
            apply_patch(self.weights, msg.payload)
        else:
            raise ValueError(f"unknown weight message kind {msg.kind!r}")
        self.version = msg.version


def make_publisher(cfg: WeightsConfig) -> WeightPublisher:
    """The publisher for `cfg.codec`."""
    if cfg.codec == "full":
        return SnapshotPublisher(cfg)
    from heterorl.weights.publisher import PatchPublisher

    return PatchPublisher(cfg)
