"""A live run's own records, as calibration reads them: the config, the event lines of the learner and of each
sampler (`live/learner.log`, `live/sampler-*.log`), summary.json.

Event lines carry `t`, the host's Unix time, so times of the learner and of a sampler compare only when they ran on
one host (or on hosts with synchronised clocks); durations measured inside one process (`seconds`, `busy`, `rtt`,
`apply_s`) need no such thing.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from heterorl.config import ConfigError, validate_config
from heterorl.eventlog import read_events


class CalibrationError(ValueError):
    """The run directory cannot be calibrated from (not a live run, logs missing); the message says what to do."""


@dataclass
class SamplerLog:
    """One sampler's events (every life of it, in file order)."""

    name: str
    events: list[dict[str, Any]] = field(default_factory=list)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == kind]


@dataclass
class RunRecords:
    run_dir: Path
    config: dict[str, Any]  # config.yaml as written
    learner: list[dict[str, Any]]  # the learner's events
    samplers: dict[str, SamplerLog]  # by sampler name, in the config's order
    summary: dict[str, Any] | None

    def learner_events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.learner if e.get("event") == kind]


def read_run(run_dir: Path) -> RunRecords:
    """Everything calibration reads from `run_dir`; CalibrationError when it is not a live run with event logs."""
    config_path, live = run_dir / "config.yaml", run_dir / "live"
    if not config_path.is_file():
        raise CalibrationError(f"{run_dir} is not a run directory (no config.yaml)")
    learner_log = live / "learner.log"
    if not learner_log.is_file():
        raise CalibrationError(
            f"{learner_log} is missing: calibrate reads a live run's event logs (`heterorl run --live` writes them)"
        )
    config = yaml.safe_load(config_path.read_text())
    try:
        names = validate_config(config).cluster.sampler_names()  # the run's own naming rule
    except ConfigError as err:
        raise CalibrationError(f"{config_path} is not a heterorl config: {err}") from None
    logs = {name: SamplerLog(name) for name in names}
    by_file: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(live.glob("sampler-*.log")):
        for event in read_events(path):
            name = event.get("sampler")
            if isinstance(name, str) and name in logs:
                by_file[name].append(event)
    for name, events in by_file.items():
        logs[name].events = events
    if not any(log.events for log in logs.values()):
        raise CalibrationError(f"no sampler events of {names} under {live} (sampler-*.log)")
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    return RunRecords(run_dir, config, read_events(learner_log), logs, summary)
