"""The numbers of the report: one `RunStats` per run from its metrics, aggregated over the seeds of a group.

Every number is computed from metrics.jsonl (summary.json only for the wall time and the staleness histogram),
so the table can be checked against the metrics. Missing values (a metric a run did not log, a non-finite value
written as null) are skipped; a statistic with no values at all is NaN and printed as n/a.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from heterorl.report.runs import Group, RunData

# The final reward is averaged over the last k steps, k = clamp(steps // 4, 1, 10), as summary.json's reward_last.
FINAL_REWARD_MAX_STEPS = 10


@dataclass(frozen=True)
class RunStats:
    """Per-run statistics; the definitions are in `run_stats` (and in the report's notes)."""

    best_accuracy: float
    last_accuracy: float
    staleness_mean: float
    kl_mean: float
    is_weight_var_mean: float
    final_reward: float
    virtual_seconds: float
    wall_seconds: float
    steps: int


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation over a group's runs (std 0 for one run)."""

    mean: float
    std: float
    n: int


def _values(records: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in records if r.get(key) is not None]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def final_reward(train: list[dict[str, Any]]) -> float:
    """Mean `reward/mean` of the last k steps, k = clamp(steps // 4, 1, FINAL_REWARD_MAX_STEPS)."""
    rewards = _values(train, "reward/mean")
    if not rewards:
        return math.nan
    k = max(1, min(FINAL_REWARD_MAX_STEPS, len(rewards) // 4))
    return _mean(rewards[-k:])


def run_stats(run: RunData) -> RunStats:
    """best/last accuracy: max / latest `eval/accuracy` over the eval records (the initial evaluation included);
    staleness, KL, IS-weight variance: means over learner steps of `stale/mean`, `obj/kl_k3`, `obj/is_weight_var`;
    clock seconds: `time/clock` of the last learner step (`time/virtual` in runs made before the name changed);
    wall seconds: summary.json `wall_seconds`."""
    accuracies = [(r["step"], float(r["eval/accuracy"])) for r in run.evals if r.get("eval/accuracy") is not None]
    virtual = _values(run.train, "time/clock") or _values(run.train, "time/virtual")
    summary = run.summary or {}
    return RunStats(
        best_accuracy=max((a for _, a in accuracies), default=math.nan),
        last_accuracy=max(accuracies, key=lambda sa: sa[0])[1] if accuracies else math.nan,
        staleness_mean=_mean(_values(run.train, "stale/mean")),
        kl_mean=_mean(_values(run.train, "obj/kl_k3")),
        is_weight_var_mean=_mean(_values(run.train, "obj/is_weight_var")),
        final_reward=final_reward(run.train),
        virtual_seconds=virtual[-1] if virtual else math.nan,
        wall_seconds=float(summary.get("wall_seconds", math.nan)),
        steps=len(run.train),
    )


def aggregate(values: list[float]) -> Stat:
    """Mean ± sample std over seeds, ignoring NaN (a run that did not log the metric)."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return Stat(math.nan, math.nan, 0)
    std = statistics.stdev(finite) if len(finite) > 1 else 0.0
    return Stat(statistics.fmean(finite), std, len(finite))


@dataclass(frozen=True)
class GroupStats:
    """A group's statistics over its runs, and the comparison with its baseline group (if one was given)."""

    name: str
    seeds: list[Any]
    stats: dict[str, Stat]  # RunStats field -> aggregate
    baseline: str | None = None
    best_delta: float = math.nan  # group mean best accuracy - baseline mean best accuracy
    last_delta: float = math.nan
    best_degradation: float = math.nan  # (baseline best - group best) / baseline best


def group_stats(group: Group) -> GroupStats:
    """Every RunStats field aggregated over the group's runs."""
    rows = [asdict(run_stats(r)) for r in group.runs]
    stats = {f: aggregate([row[f] for row in rows]) for f in RunStats.__dataclass_fields__}
    return GroupStats(group.name, [r.seed for r in group.runs], stats)


def with_baseline(stats: GroupStats, ref: GroupStats) -> GroupStats:
    """Add the comparison with the reference group: differences of the mean accuracies (group - baseline; negative
    is worse) and the relative degradation of the best accuracy ((baseline - group) / baseline; positive is worse)."""
    best, ref_best = stats.stats["best_accuracy"].mean, ref.stats["best_accuracy"].mean
    return GroupStats(
        name=stats.name,
        seeds=stats.seeds,
        stats=stats.stats,
        baseline=ref.name,
        best_delta=best - ref_best,
        last_delta=stats.stats["last_accuracy"].mean - ref.stats["last_accuracy"].mean,
        best_degradation=(ref_best - best) / ref_best if ref_best else math.nan,
    )
