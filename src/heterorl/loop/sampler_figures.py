"""Per-sampler figures the learner records, the same under every clock: groups each sampler delivered (accepted by
the intake) and had trained, the staleness of its trained groups, and how far its weights lag the learner's.

    staleness of a trained group = learner version when it is trained - the oldest version among its tokens
    weights lag of a sampler     = learner version at a record - the version the sampler generates with, as it
                                   last reported it (in its uploads and weight pulls)

Only the run's own sampler names (`cluster.samplers`) are counted: names arrive from the network, and a made-up one
must not grow every metrics record. Every record carries, for each sampler, `sampler/<name>/accepted_total` and
`/trained_total`; `/stale_mean` and `/stale_max` (over its groups trained so far) once one was trained; `/lag`
once it reported a version. summary.json's `per_sampler` adds the histograms, shares and the lag's mean and max.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from heterorl.rollout import RolloutGroup


@dataclass
class SamplerFigures:
    """Counters per sampler name (see the module docstring). Not thread-safe: the learner loop calls it under the
    intake's lock (`accepted`) or from its one training thread (`trained`, `record`)."""

    names: tuple[str, ...]
    accepted_n: Counter[str] = field(default_factory=Counter)
    trained_n: Counter[str] = field(default_factory=Counter)
    staleness: dict[str, Counter[int]] = field(default_factory=dict)
    lag_sum: Counter[str] = field(default_factory=Counter)
    lag_records: Counter[str] = field(default_factory=Counter)
    lag_max: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, names: Iterable[str]) -> SamplerFigures:
        return cls(tuple(names))

    def accepted(self, sampler: str) -> None:
        """One group of `sampler` accepted by the intake (its first arrival)."""
        if sampler in self.names:
            self.accepted_n[sampler] += 1

    def trained(self, groups: list[RolloutGroup], learner_version: int) -> None:
        """A batch about to be trained at `learner_version`: each group's staleness, by its sampler."""
        for g in groups:
            if g.sampler_id in self.names:
                self.trained_n[g.sampler_id] += 1
                self.staleness.setdefault(g.sampler_id, Counter())[g.staleness(learner_version)] += 1

    def record(self, learner_version: int, reported: Mapping[str, int | None]) -> dict[str, float]:
        """The `sampler/<name>/...` keys of a metrics record at `learner_version`; `reported`: each sampler's
        version as it last reported it (None: not yet). Accumulates the lag for the summary."""
        out: dict[str, float] = {}
        for name in self.names:
            out[f"sampler/{name}/accepted_total"] = float(self.accepted_n[name])
            out[f"sampler/{name}/trained_total"] = float(self.trained_n[name])
            hist = self.staleness.get(name)
            if hist:
                out[f"sampler/{name}/stale_mean"] = _mean(hist)
                out[f"sampler/{name}/stale_max"] = float(max(hist))
            version = reported.get(name)
            if version is not None:
                lag = learner_version - version
                out[f"sampler/{name}/lag"] = float(lag)
                self.lag_sum[name] += lag
                self.lag_records[name] += 1
                self.lag_max[name] = max(self.lag_max.get(name, lag), lag)
        return out

    def summary(self) -> dict[str, dict[str, Any]]:
        """summary.json's `per_sampler`: per name, groups accepted and trained, its share of all trained groups,
        its staleness (mean, max, histogram) and weights lag (mean and max over the records; None if never
        reported)."""
        total = sum(self.trained_n.values())
        out = {}
        for name in self.names:
            hist = self.staleness.get(name, Counter())
            records = self.lag_records[name]
            out[name] = {
                "accepted": self.accepted_n[name],
                "trained": self.trained_n[name],
                "trained_share": self.trained_n[name] / total if total else 0.0,
                "staleness_mean": _mean(hist) if hist else None,
                "staleness_max": max(hist) if hist else None,
                "staleness_histogram": {str(k): v for k, v in sorted(hist.items())},
                "lag_mean": self.lag_sum[name] / records if records else None,
                "lag_max": self.lag_max.get(name),
            }
        return out

    # ---------------------------------------------------------------- durability (resume)
    def to_json(self) -> dict[str, Any]:
        return {
            "accepted": dict(self.accepted_n),
            "trained": dict(self.trained_n),
            "staleness": {n: {str(k): v for k, v in h.items()} for n, h in self.staleness.items()},
            "lag": {n: [self.lag_sum[n], self.lag_records[n], self.lag_max[n]] for n in self.lag_max},
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        """Counters of a saved state (names no longer in the run are dropped)."""
        keep = set(self.names)
        self.accepted_n = Counter({n: int(v) for n, v in data["accepted"].items() if n in keep})
        self.trained_n = Counter({n: int(v) for n, v in data["trained"].items() if n in keep})
        self.staleness = {
            n: Counter({int(k): int(v) for k, v in h.items()}) for n, h in data["staleness"].items() if n in keep
        }
        lag = {n: v for n, v in data["lag"].items() if n in keep}
        self.lag_sum = Counter({n: int(v[0]) for n, v in lag.items()})
        self.lag_records = Counter({n: int(v[1]) for n, v in lag.items()})
        self.lag_max = {n: int(v[2]) for n, v in lag.items()}


def trained_lineage(groups: list[RolloutGroup]) -> list[list[Any]]:
    """A step's groups as its `trained` event lists them: [[group id, oldest token version, sampler], ...]."""
    return [[g.group_id, g.min_version, g.sampler_id] for g in groups]


def _mean(hist: Counter[int]) -> float:
    return sum(k * v for k, v in hist.items()) / sum(hist.values())
