"""A sampler's weights and engine, used by every driver: updates in (hash-checked, all or nothing), groups out.

    receive(update)       a weight update from the transport, applied to the receiver (or refused, counted)
    process = generate(n) load the newest weights received, then sample -> score: a suspendable process yielding
                          tokens sampled so far; with `sampler.interruptible` it loads newer weights between two
                          decoding steps

What to generate and when is the session's (`loop.session`). The simulated driver paces `generate` in virtual time
(tokens / speed); the live driver runs it in a thread while another receives weights, so the receiver and the
engine's weights are guarded by one lock.
"""

from __future__ import annotations

import threading
from collections.abc import Generator
from typing import Protocol

from heterorl.config import RunConfig
from heterorl.engines.base import EngineError
from heterorl.rollout import RolloutGroup
from heterorl.sampler import Sampler
from heterorl.weights import Update, WeightReceiver

# What parsing hostile bytes can raise (PatchError and EnvelopeError are ValueErrors); a bug raises anything else
HOSTILE_INPUT_ERRORS = (ValueError, RecursionError, OverflowError)


class InProcessUpdate(Protocol):
    """A version handed over by reference in one process (the simulator's `SharedUpdate`): the receiver the driver
    gave the worker knows how to `adopt` it."""

    version: int


class SamplerWorker:
    """One sampler's receiver and engine (see the module docstring)."""

    def __init__(self, cfg: RunConfig, index: int, sampler: Sampler, receiver: WeightReceiver | None = None) -> None:
        if cfg.sampler.interruptible and not sampler.engine.interruptible:
            raise EngineError(
                f"sampler.interruptible needs an engine that takes weights mid-generation; "
                f"{sampler.engine.name!r} does not (set sampler.interruptible: false)"
            )
        self.index, self.sampler, self.name = index, sampler, sampler.sampler_id
        self.receiver = receiver if receiver is not None else WeightReceiver(workers=cfg.weights.codec_threads)
        self.lock = threading.Lock()  # the receiver's weights and the engine's weights
        self.interruptible = cfg.sampler.interruptible
        self.applied = self.failed = self.ignored = 0  # weight updates
        self.last_error: str | None = None
        self.tokens = 0
        self._landed = 0  # updates that landed in the receiver,
        self._loaded = 0  # and how many of them the engine has seen

    # ---------------------------------------------------------------- weights
    def held(self) -> tuple[int | None, str | None]:
        """(version, hash) the next update must start from; (None, None) asks for a snapshot."""
        with self.lock:
            return self.receiver.held()

    def receive(self, update: Update | InProcessUpdate) -> bool:
        """Apply one update; True when the receiver now holds a newer verified version. A duplicate of what it
        holds is ignored; a refused update (corrupt, wrong base) is counted and leaves the weights as they were,
        and the next update asked for is a snapshot. A `SharedUpdate` (the learner's own tensors, in-process) is
        adopted as it is: it is the version's bits.

        The bytes came from the network, so a parse error the receiver did not turn into a refusal is a refusal
        here too (never an exception that stops the sampler); the engine keeps the weights it generates with,
        and the next update is a snapshot, which rewrites every weight."""
        with self.lock:
            if not isinstance(update, Update):  # in-process: the driver's receiver adopts it by reference
                held = self.receiver.version
                if not self.receiver.needs_snapshot and held is not None and update.version <= held:
                    self.ignored += 1
                    return False
                self.receiver.adopt(update)  # type: ignore[attr-defined]
                ok = True
            else:
                if (update.version, update.state_hash) == self.receiver.held():
                    self.ignored += 1
                    return False
                try:
                    ok = self.receiver.apply(update)
                except HOSTILE_INPUT_ERRORS as err:
                    ok, self.receiver.needs_snapshot = False, True
                    self.receiver.last_error = f"{type(err).__name__}: {str(err)[:200]}"
            self.last_error = self.receiver.last_error
            self._landed += ok
        if ok:
            self.applied += 1
        else:
            self.failed += 1
        return ok

    def refused(self, error: str) -> None:
        """An update that could not even be decoded (counted like a refused one)."""
        with self.lock:
            self.receiver.needs_snapshot = True
            self.last_error = error
        self.failed += 1

    def refresh(self) -> bool:
        """Load the newest received weights into the engine if it generates with older ones."""
        with self.lock:
            version = self.receiver.version
            if version is None or self._landed == self._loaded:
                return False
            assert self.receiver.weights is not None
            self.sampler.load_weights(version, self.receiver.weights)
            self._loaded = self._landed
        return True

    # ---------------------------------------------------------------- generation
    @property
    def version(self) -> int:
        """The version the engine generates with (-1: none yet)."""
        return self.sampler.version

    def generate(self, n: int, load: bool = True) -> Generator[int, None, list[RolloutGroup]]:
        """Load the newest weights (unless `load` is False: other generations of the current version still run on
        an engine that is not interruptible), then sample and score n groups, yielding tokens sampled so far
        after every decoding step."""
        if load:
            self.refresh()
        process = self.sampler.iter_groups(n)
        while True:
            try:
                tokens = next(process)
            except StopIteration as end:
                groups: list[RolloutGroup] = end.value
                break
            yield tokens
            if self.interruptible:
                self.refresh()
        self.tokens += sum(g.num_tokens for g in groups)
        return groups
