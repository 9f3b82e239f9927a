"""Reading run directories and grouping them: runs whose configs differ only by `seed` form one group.

Configs are read as written (raw YAML, not re-validated), so runs made by an older version still load and the
report shows what actually ran. Group names list only the keys that tell groups apart (`heterorl.report.labels`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from heterorl.config import ConfigError, parse_override
from heterorl.metrics import read_metrics
from heterorl.report.labels import MISSING, canonical, format_value, group_labels


class ReportError(ValueError):
    """The report's inputs are unusable: a path is not a run directory, the baseline matches nothing, ..."""


@dataclass
class RunData:
    """One run directory, loaded. `summary` is None while the run has not finished."""

    path: Path
    config: dict[str, Any]  # flattened: dotted key -> value (see `flatten`)
    train: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    summary: dict[str, Any] | None

    @property
    def seed(self) -> Any:
        return self.config.get("seed")


@dataclass
class Group:
    """Runs that differ only by seed (or share the `group_by` values); `label` maps naming keys to values."""

    name: str
    label: dict[str, Any]
    runs: list[RunData] = field(default_factory=list)


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Nested config -> {dotted.key: value}. A list adds `<key>.count` so runs with more samplers are told apart
    by one key rather than by every field of the extra samplers."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(node, list):
        out = {f"{prefix}.count": len(node)}
        for i, value in enumerate(node):
            out.update(flatten(value, f"{prefix}.{i}"))
        return out
    return {prefix: node}


def find_run_dirs(paths: list[Path]) -> list[Path]:
    """Run directories among `paths`: a path holding config.yaml is one; otherwise (a sweep's `out`) each of its
    sub-directories holding config.yaml is one, in name order."""
    found: list[Path] = []
    for path in paths:
        if (path / "config.yaml").is_file():
            found.append(path)
            continue
        children = sorted(p for p in path.glob("*/") if (p / "config.yaml").is_file()) if path.is_dir() else []
        if not children:
            raise ReportError(f"{path} is not a run directory (no config.yaml) and holds none")
        found.extend(children)
    return found


def load_run(path: Path) -> RunData:
    """config.yaml, metrics.jsonl and (if the run finished) summary.json of one run directory; ReportError
    naming the file when one is missing or unreadable (the leftovers of a run that failed early)."""
    for name in ("config.yaml", "metrics.jsonl"):
        if not (path / name).is_file():
            raise ReportError(f"{path} has no {name}")
    try:
        config = yaml.safe_load((path / "config.yaml").read_text())
    except yaml.YAMLError as exc:
        raise ReportError(f"{path / 'config.yaml'}: not valid YAML ({exc})") from None
    if not isinstance(config, dict):
        raise ReportError(f"{path / 'config.yaml'}: the top level must be a mapping")
    try:
        records = read_metrics(path / "metrics.jsonl")
        summary_path = path / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: a JSON file is cut short or corrupt ({exc})") from None
    return RunData(
        path=path,
        config=flatten(config),
        train=[r for r in records if r.get("kind") == "train"],
        evals=[r for r in records if r.get("kind") == "eval"],
        summary=summary,
    )


@dataclass
class Grouping:
    """Groups in first-seen order, the keys they are compared on, and the common values their names leave out
    (as label text, "" if none)."""

    groups: list[Group]
    keys: list[str]
    unlisted: str = ""


def group_runs(runs: list[RunData], group_by: list[str] | None = None) -> Grouping:
    """Group the runs (see `Grouping`).

    Without `group_by`, runs with identical configs apart from `seed` form a group, named by the keys that tell
    it apart (`heterorl.report.labels`). With `group_by`, the listed keys alone define and name the groups.
    """
    unknown = [k for k in group_by or [] if all(k not in r.config for r in runs)]
    if unknown:
        raise ReportError(f"group_by keys {unknown} are in no run's config (dotted keys, e.g. cluster.mode)")
    by_identity: dict[str, Group] = {}
    configs: dict[str, dict[str, Any]] = {}
    for run in runs:
        values = {k: run.config.get(k, MISSING) for k in group_by} if group_by else _without_seed(run.config)
        identity = canonical(sorted(values.items()))
        if identity not in by_identity:
            by_identity[identity] = Group(name="", label={})
            configs[identity] = values
        by_identity[identity].runs.append(run)
    groups = list(by_identity.values())
    naming = group_labels([configs[i] for i in by_identity], group_by)
    for group, label, name in zip(groups, naming.labels, naming.names, strict=True):
        group.label, group.name = label, name or "all runs"
    return Grouping(groups, naming.keys, naming.unlisted)


def _without_seed(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "seed"}


def parse_baseline(text: str) -> tuple[str, Any]:
    """`cluster.mode=sync` -> ("cluster.mode", "sync"); the value is parsed as YAML, as in overrides."""
    try:
        path, value = parse_override(text)
    except ConfigError as exc:
        raise ReportError(f"--baseline: {exc}") from None
    return ".".join(path), value


def baseline_for(groups: list[Group], baseline: str) -> dict[str, Group]:
    """The reference group of every group: among the groups whose runs all have KEY=VALUE, the one whose config
    agrees with the group's on most keys (so with objectives x modes, each async objective is compared with the
    sync run of the same objective)."""
    key, value = parse_baseline(baseline)
    refs = [g for g in groups if all(r.config.get(key, MISSING) == value for r in g.runs)]
    if not refs:
        seen = sorted({format_value(r.config.get(key, MISSING)) for g in groups for r in g.runs})
        raise ReportError(f"--baseline {baseline}: no group has {key}={format_value(value)} (values seen: {seen})")

    def agreement(a: Group, b: Group) -> int:
        ca, cb = _without_seed(a.runs[0].config), _without_seed(b.runs[0].config)
        return sum(canonical(ca.get(k)) == canonical(cb.get(k)) for k in ca.keys() | cb.keys())

    return {g.name: g if any(g is r for r in refs) else max(refs, key=lambda r: agreement(g, r)) for g in groups}
