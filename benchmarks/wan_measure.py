"""What `wan_bench.py` measures in a run directory, the same way for a live run (metrics.jsonl, summary.json and the
processes' event logs) and a simulated one (metrics.jsonl and summary.json).

Definitions (on the run's own clock: the learner's wall clock live, virtual time simulated):
- the window: from the first learner step's record to the last (metrics.jsonl `time/clock`), so the samplers'
  start-up (imports, the first snapshot) does not dilute the steady rate; `whole` figures count from clock 0;
- trained groups/s = groups trained in the window / its length;
- the learner's idle share in the window = 1 - busy / length, with busy(t) = (1 - perf/learner_idle(t)) * t the
  seconds the learner spent in training steps up to t;
- staleness (of trained groups: learner version at use - oldest token version): summary.json's histogram; mean,
  p90 by nearest rank (the smallest k with at least 90% of the groups at staleness <= k), max;
- per sampler (summary.json `per_sampler`, both clocks): share of the trained groups, mean staleness of its groups;
- a live sampler's accepted groups/s = its groups acknowledged (`pushed` with an ACKED outcome, at the verdict's
  arrival) inside the window / its length; its generation speed = tokens / seconds its generation was busy (its
  `finished` summary); its start = `started` event time on the learner's clock.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import yaml

from heterorl.calibrate.measure import commit_cost, intake_cost
from heterorl.calibrate.records import read_run
from heterorl.loop.intake import ACKED
from heterorl.report.side_by_side import percentile


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """JSON lines of a file; other lines (warnings on the same stream) and a line cut short are skipped."""
    out: list[dict[str, Any]] = []
    if not path.is_file():
        return out
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def staleness_figures(histogram: dict[str, int]) -> dict[str, float]:
    """Mean, p90 (nearest rank) and max of a staleness histogram {steps: groups}."""
    hist = {int(k): int(v) for k, v in histogram.items() if int(v) > 0}
    total = sum(hist.values())
    if not total:
        return {"mean": float("nan"), "p90": float("nan"), "max": float("nan"), "groups": 0}
    mean = sum(k * v for k, v in hist.items()) / total
    return {"mean": mean, "p90": percentile(hist, 0.9), "max": float(max(hist)), "groups": total}


def train_window(records: list[dict[str, Any]], groups_per_step: int) -> dict[str, float]:
    """Throughput and idle share over the window of learner steps (see the module doc)."""
    steps = [r for r in records if r.get("kind") == "train"]
    if len(steps) < 2:
        raise ValueError(f"{len(steps)} learner steps recorded: too few to measure a rate")
    first, last = steps[0], steps[-1]
    t0, t1 = first["time/clock"], last["time/clock"]
    busy0 = (1.0 - first["perf/learner_idle"]) * t0
    busy1 = (1.0 - last["perf/learner_idle"]) * t1
    seconds = t1 - t0
    return {
        "start": t0,
        "end": t1,
        "seconds": seconds,
        "trained_per_s": (last["step"] - first["step"]) * groups_per_step / seconds,
        "idle": 1.0 - (busy1 - busy0) / seconds,
        "steps": last["step"],
        "whole_trained_per_s": last["step"] * groups_per_step / t1,
        "whole_idle": last["perf/learner_idle"],
        "step_busy_s": (busy1 - busy0) / (last["step"] - first["step"]),
    }


def run_figures(run_dir: Path) -> dict[str, Any]:
    """What both clocks record: the window, staleness, per-sampler shares and staleness, accuracy."""
    summary = json.loads((run_dir / "summary.json").read_text())
    records = read_jsonl(run_dir / "metrics.jsonl")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    per = summary.get("per_sampler") or {}
    return {
        "window": train_window(records, int(config["learner"]["groups_per_step"])),
        "staleness": staleness_figures(summary["staleness_histogram"]),
        "shares": {n: float(v["trained_share"]) for n, v in per.items()},
        "sampler_staleness": {n: v.get("staleness_mean") for n, v in per.items()},
        "accuracy_final": summary.get("accuracy_final"),
        "clock_seconds": summary["clock_seconds"],
    }


def clock_origin(learner_events: list[dict[str, Any]], records: list[dict[str, Any]]) -> float:
    """The unix time of the live learner's clock zero: a step's `trained` event minus its record's clock time
    (median over steps; the event follows the record within the step's commit)."""
    clock = {r["step"]: r["time/clock"] for r in records if r.get("kind") == "train"}
    offsets = [
        e["t"] - clock[e["version"]] for e in learner_events if e["event"] == "trained" and e["version"] in clock
    ]
    if not offsets:
        raise ValueError("no learner step both in metrics.jsonl and in the learner's events")
    return statistics.median(offsets)


def sampler_figures(events: list[dict[str, Any]], origin: float, window: dict[str, float]) -> dict[str, Any]:
    """One live sampler's figures from its event log (times in seconds of the learner's clock)."""
    lo, hi = origin + window["start"], origin + window["end"]
    acked = [e["t"] for e in events if e["event"] == "pushed" and e.get("outcome") in ACKED]
    started = next((e["t"] for e in events if e["event"] == "started"), None)
    finished = next((e for e in events if e["event"] == "finished"), None)
    in_window = sum(lo <= t <= hi for t in acked)
    out: dict[str, Any] = {
        "accepted": len(acked),
        "accepted_per_s": in_window / window["seconds"],
        "started_s": None if started is None else started - origin,
        "link_down": sum(e["event"] == "link_down" for e in events),
        "retries": sum(e["event"] == "retry" for e in events),
        "tokens_per_s": None,
    }
    if finished is not None and started is not None and finished.get("tokens"):
        busy = (1.0 - finished["idle"]) * (finished["t"] - started)
        out.update(idle=finished["idle"], tokens_per_s=finished["tokens"] / busy if busy > 0 else None)
    return out


def live_figures(run_dir: Path, names: list[str]) -> dict[str, Any]:
    """A live run's figures: `run_figures`, and each sampler's (in config order) from its event log."""
    out = run_figures(run_dir)
    records = read_jsonl(run_dir / "metrics.jsonl")
    origin = clock_origin(read_jsonl(run_dir / "live" / "learner.log"), records)
    logs = [read_jsonl(run_dir / "live" / f"sampler-{i}.log") for i in range(len(names))]
    out["samplers"] = {
        name: sampler_figures(events, origin, out["window"]) for name, events in zip(names, logs, strict=True)
    }
    out["learner_step_seconds"] = out["window"]["step_busy_s"]
    run_records = read_run(run_dir)  # what `heterorl calibrate` reads, for the figures it writes
    intake = intake_cost(run_records)
    out["intake_s_per_group"] = intake.value if intake is not None else 0.0
    commit, evaluation = commit_cost(run_records)
    out["commit_s"] = commit.value if commit is not None else 0.0
    out["eval_s"] = evaluation.value if evaluation is not None else 0.0
    return out
