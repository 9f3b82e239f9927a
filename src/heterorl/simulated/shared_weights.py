"""Published versions handed to samplers in the learner's own process, by reference instead of as bytes.

A sampler must hold exactly the version it was sent, bit for bit. When the sampler lives in the learner's process
(the simulated cluster), the learner's published wire-dtype tensors of that version *are* those bits: the learner
exports a fresh copy per version (`Learner.export_weights`) and nothing writes to it afterwards (the publisher's
contract), so every sampler can take the very same tensors. Decoding the patch bytes would only rebuild them, at
the cost of a decode (hash checks, gathers, scatters) per sampler per version on the simulation's critical path.

What the bytes still decide -- their size on a link, the version's hash -- comes from the real encode, which the
simulator settles once the background publish is done (`heterorl.simulated.cluster`). Links that can alter a
message (faults) always carry the real bytes, and a receiver that adopted shared tensors copies them before it
applies any bytes in place (copy on write), so the learner's tensors are never written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from heterorl.weights import Update, WeightReceiver


@dataclass(eq=False)
class SharedUpdate:
    """Version `version` as the learner published it: its wire-dtype tensors (read-only by contract) and, once
    the publish is complete, its state hash (`settle()` makes it so)."""

    version: int
    weights: Mapping[str, torch.Tensor]
    settle: Callable[[], None] = field(repr=False)
    state_hash: str | None = None

    def resolved_hash(self) -> str:
        """The version's state hash, waiting for its publish if it is still running."""
        if self.state_hash is None:
            self.settle()
        assert self.state_hash is not None, f"settling version {self.version} did not set its hash"
        return self.state_hash


class SharedReceiver(WeightReceiver):
    """A `WeightReceiver` that can also adopt a `SharedUpdate` by reference.

    Its state hash is read lazily after an adoption (nothing a sampler does while generating needs it), so adopting
    never waits for the publish; bytes applied later (a snapshot, a patch) first copy adopted tensors.
    """

    def __init__(self, *, workers: int = 1) -> None:
        self._shared: SharedUpdate | None = None
        self._hash: str | None = None
        self._borrowed = False  # `weights` are the learner's tensors
        super().__init__(workers=workers)

    @property  # type: ignore[override]
    def state_hash(self) -> str | None:
        if self._shared is not None:
            self._hash, self._shared = self._shared.resolved_hash(), None
        return self._hash

    @state_hash.setter
    def state_hash(self, value: str | None) -> None:
        self._shared, self._hash = None, value

    def adopt(self, update: SharedUpdate) -> None:
        """Hold `update`'s version: its tensors by reference, its hash once known."""
        self.weights = dict(update.weights)
        self.version = update.version
        self.state_hash = None
        self._shared = update
        self._borrowed = True
        self.needs_snapshot = False
        self.last_error = None

    def apply(self, update: Update) -> bool:
        if self._borrowed and self.weights is not None:  # copy on write: never touch the learner's tensors
            self.weights = {name: t.clone() for name, t in self.weights.items()}
            self._borrowed = False
        return super().apply(update)
