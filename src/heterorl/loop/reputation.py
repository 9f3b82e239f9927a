"""Per-sampler records and quarantine: a clock-free policy object, counted in groups and learner steps.

Every group a sampler sends ends in an outcome (accepted, or a refusal reason from `loop.intake` and the trust
checks); every verified group passes or fails; every group the learner drops from a step as poison is charged.
A sampler's record holds those counts. Some refusals are evidence against the sampler (`CHARGED`: content it
made, which no link or learner fault explains); the others (busy, duplicate, corrupt in transit, timeouts, a full
disk, ...) are not, nor is `too_long`: an honest sampler with the learner's own config sends it when a data set's
prompt plus its completion outgrow the model's context, so it says the data and the model disagree, not who lies.

Quarantine (the sampler's groups are refused as `quarantined`, and its admission grants withdrawn by the driver):
- `max_charges` charged groups among its last `window` judged ones (accepted or charged), or
- its verified tokens, pooled, fail the sampling-calibration test (`loop/verifier.py`): with n tokens and u their
  probability integral transforms, |sum u - n/2| / sqrt(n/12) > `z_tolerance`. One group shows a gross shift;
  the pooled test shows a small one that persists (another model's completions re-scored under the claimed
  version), and honest samplers stay N(0, 1) however long they run.
A quarantine lasts `release_after_steps` learner steps (None: until the learner restarts or `lift` is called).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from heterorl.config.trust import ReputationConfig

CHARGED = frozenset(
    {
        "reward_mismatch",
        "unknown_prompt",
        "logprob_mismatch",
        "atypical_tokens",
        "replayed",
        "poisoned",
        "bad_logprobs",
        "bad_rewards",
        "out_of_vocab",
        "future_version",
        "group_size",
        "prompt_mismatch",
        "invalid",
        "id_conflict",
    }
)
"""Outcomes held against the sampler that sent the group."""

MIN_POOLED_TOKENS = 64  # the pooled calibration test waits for this many verified tokens (Irwin-Hall ~ normal)


@dataclass
class SamplerRecord:
    """What one sampler's groups came to."""

    accepted: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    verified: int = 0  # groups re-scored that passed
    failed: int = 0  # groups re-scored that failed (also in `refused` by reason)
    poisoned: int = 0  # accepted groups the learner dropped from a step
    pit_sum: float = 0.0  # the calibration test over all its verified tokens
    pit_tokens: int = 0
    quarantined_at: int | None = None  # learner version when quarantined
    recent: deque[bool] = field(default_factory=deque)  # its last judged groups: True = charged

    @property
    def pooled_z(self) -> float:
        n = self.pit_tokens
        return 0.0 if n == 0 else (self.pit_sum - n / 2) / math.sqrt(n / 12)

    def to_json(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "refused": dict(self.refused),
            "verified": self.verified,
            "failed": self.failed,
            "poisoned": self.poisoned,
            "pit_sum": self.pit_sum,
            "pit_tokens": self.pit_tokens,
            "quarantined_at": self.quarantined_at,
            "recent": "".join("1" if x else "0" for x in self.recent),  # oldest first, 1 = charged
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SamplerRecord:
        rec = cls(**{k: v for k, v in data.items() if k not in ("refused", "recent")})
        rec.refused = Counter(data["refused"])
        rec.recent = deque(x == "1" for x in data["recent"])
        return rec


class Reputation:
    """The records of the cluster's samplers and the quarantine policy (see the module docstring)."""

    def __init__(self, cfg: ReputationConfig, names: Iterable[str]) -> None:
        self.cfg = cfg
        self.records: dict[str, SamplerRecord] = {name: SamplerRecord() for name in names}
        self.version = 0  # the learner's, as `on_step` last said

    def _record(self, sampler: str) -> SamplerRecord:
        return self.records.setdefault(sampler, SamplerRecord())

    # ---------------------------------------------------------------- what happened
    def record(self, sampler: str, outcome: str) -> None:
        """One group's outcome at the intake: accepted, or a refusal reason."""
        rec = self._record(sampler)
        if outcome == "accepted":
            rec.accepted += 1
            self._judged(rec, charged=False)
        elif outcome in ("duplicate", "filtered", "busy", "finished"):
            return
        else:
            rec.refused[outcome] += 1
            if outcome in CHARGED:
                self._judged(rec, charged=True)

    def verified(self, sampler: str, ok: bool, pit_sum: float, tokens: int) -> None:
        """A re-scored group: passed or failed (its refusal is recorded by `record`), and its tokens' u."""
        rec = self._record(sampler)
        rec.verified += ok
        rec.failed += not ok
        rec.pit_sum += pit_sum
        rec.pit_tokens += tokens
        if rec.pit_tokens >= MIN_POOLED_TOKENS and abs(rec.pooled_z) > self.cfg.z_tolerance:
            self._quarantine(rec)

    def poisoned(self, sampler: str) -> None:
        """An accepted group of `sampler` the learner dropped from a step (its gradient was not finite)."""
        rec = self._record(sampler)
        rec.poisoned += 1
        rec.refused["poisoned"] += 1
        self._judged(rec, charged=True)

    def _judged(self, rec: SamplerRecord, charged: bool) -> None:
        rec.recent.append(charged)
        while len(rec.recent) > self.cfg.window:
            rec.recent.popleft()
        if sum(rec.recent) >= self.cfg.max_charges:
            self._quarantine(rec)

    def _quarantine(self, rec: SamplerRecord) -> None:
        if rec.quarantined_at is None:
            rec.quarantined_at = self.version

    # ---------------------------------------------------------------- the policy
    def quarantined(self, sampler: str) -> bool:
        rec = self.records.get(sampler)
        return rec is not None and rec.quarantined_at is not None

    def on_step(self, version: int) -> list[str]:
        """The learner reached `version`; returns the samplers whose quarantine ended (`release_after_steps`)."""
        self.version = version
        after = self.cfg.release_after_steps
        released = []
        if after is not None:
            for name, rec in self.records.items():
                if rec.quarantined_at is not None and version - rec.quarantined_at >= after:
                    self.lift(name)
                    released.append(name)
        return released

    def lift(self, sampler: str) -> None:
        """End `sampler`'s quarantine and forget the charges that caused it (an operator's decision)."""
        rec = self._record(sampler)
        rec.quarantined_at = None
        rec.recent.clear()
        rec.pit_sum, rec.pit_tokens = 0.0, 0

    # ---------------------------------------------------------------- reporting and state
    def metrics(self) -> dict[str, float]:
        """`trust/*` keys of a metrics record."""
        out = {"trust/quarantined": float(sum(r.quarantined_at is not None for r in self.records.values()))}
        for name, rec in sorted(self.records.items()):
            out[f"trust/{name}/charged"] = float(sum(rec.refused[r] for r in CHARGED))
            out[f"trust/{name}/verified"] = float(rec.verified)
            out[f"trust/{name}/failed"] = float(rec.failed)
            out[f"trust/{name}/quarantined"] = float(rec.quarantined_at is not None)
        return out

    def to_json(self) -> dict[str, Any]:
        return {name: rec.to_json() for name, rec in sorted(self.records.items())}

    def restore(self, data: dict[str, Any]) -> None:
        self.records.update({name: SamplerRecord.from_json(rec) for name, rec in data.items()})
