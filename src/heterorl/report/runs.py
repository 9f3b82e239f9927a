"""Reading run directories and grouping them: runs whose configs differ only by `seed` form one group.

Configs are read as written (raw YAML, not re-validated), so runs made by an older version still load and the
report shows what actually ran. Group names list only the keys that tell groups apart (see `naming_keys`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from heterorl.config import ConfigError, parse_override
from heterorl.metrics import read_metrics
from heterorl.naming import short_keys

DISCRIMINATORS = ("name", "kind")  # the keys that choose an implementation (config.py's discriminated unions)
MISSING = "unset"  # how a key absent from a run's config is shown (another objective or delay model, say)


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
    """config.yaml, metrics.jsonl and (if the run finished) summary.json of one run directory."""
    for name in ("config.yaml", "metrics.jsonl"):
        if not (path / name).is_file():
            raise ReportError(f"{path} has no {name}")
    config = yaml.safe_load((path / "config.yaml").read_text())
    if not isinstance(config, dict):
        raise ReportError(f"{path / 'config.yaml'}: the top level must be a mapping")
    records = read_metrics(path / "metrics.jsonl")
    summary_path = path / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else None
    return RunData(
        path=path,
        config=flatten(config),
        train=[r for r in records if r.get("kind") == "train"],
        evals=[r for r in records if r.get("kind") == "eval"],
        summary=summary,
    )


def format_value(value: Any) -> str:
    """Values as they are written in overrides (`true`, `null`, `0.0003`, `{kind: weibull, ...}`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict | list):
        return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return str(value)


def differing_keys(runs: list[RunData], exclude: frozenset[str] = frozenset({"seed"})) -> list[str]:
    """Keys whose value (or presence) differs across runs, in config order."""
    keys: dict[str, None] = {}
    for run in runs:
        keys.update(dict.fromkeys(run.config))
    return [k for k in keys if k not in exclude and len({_key(r.config.get(k, MISSING)) for r in runs}) > 1]


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def discriminator(key: str, keys: list[str]) -> str | None:
    """The nearest `<section>.name` / `<section>.kind` above `key` that is among `keys` (it differs)."""
    parts = key.split(".")
    for n in range(len(parts) - 1, 0, -1):
        for tag in DISCRIMINATORS:
            candidate = ".".join([*parts[:n], tag])
            if candidate != key and candidate in keys:
                return candidate
    return None


def naming_keys(groups: list[dict[str, Any]], keys: list[str]) -> list[list[str]]:
    """For each group's config, the differing keys worth naming it by. A key counts for a group if the group has
    it and it takes more than one value among the groups that have it and share the group's discriminator value
    (the objective's `name`, a delay model's `kind`). So `objective.name=gepo` names a group without every field
    that GEPO sets differently from GRPO, while a GRPO field varied between GRPO runs still shows."""
    disc = {k: discriminator(k, keys) for k in keys}

    def varies(key: str, config: dict[str, Any]) -> bool:
        d = disc[key]
        peers = [g for g in groups if key in g and (d is None or _key(g.get(d)) == _key(config.get(d)))]
        return len({_key(g[key]) for g in peers}) > 1

    return [[k for k in keys if k in config and varies(k, config)] for config in groups]


def group_runs(runs: list[RunData], group_by: list[str] | None = None) -> tuple[list[Group], list[str]]:
    """Groups in first-seen order, and the keys that define them.

    Without `group_by`, runs with identical configs apart from `seed` form a group and the group is named by
    `naming_keys`. With `group_by`, the listed keys alone define and name the groups.
    """
    unknown = [k for k in group_by or [] if all(k not in r.config for r in runs)]
    if unknown:
        raise ReportError(f"group_by keys {unknown} are in no run's config (dotted keys, e.g. cluster.mode)")
    keys = group_by if group_by is not None else differing_keys(runs)
    by_identity: dict[str, Group] = {}
    configs: dict[str, dict[str, Any]] = {}
    for run in runs:
        values = {k: run.config.get(k, MISSING) for k in keys} if group_by else _without_seed(run.config)
        identity = _key(sorted(values.items()))
        if identity not in by_identity:
            by_identity[identity] = Group(name="", label={})
            configs[identity] = values
        by_identity[identity].runs.append(run)
    groups = list(by_identity.values())
    config_list = [configs[i] for i in by_identity]
    named = [keys] * len(groups) if group_by else naming_keys(config_list, keys)
    if len({tuple((k, _key(c[k])) for k in n) for c, n in zip(config_list, named, strict=True)}) < len(groups):
        named = [[k for k in keys if k in c] for c in config_list]  # fall back to every differing key
    short = short_keys(keys)
    for group, config, names in zip(groups, config_list, named, strict=True):
        group.label = {k: config.get(k, MISSING) for k in names}
        text = ", ".join(f"{short[k]}={format_value(v)}" for k, v in group.label.items())
        group.name = text or "all runs"
    return groups, keys


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
        return sum(_key(ca.get(k)) == _key(cb.get(k)) for k in ca.keys() | cb.keys())

    return {g.name: g if any(g is r for r in refs) else max(refs, key=lambda r: agreement(g, r)) for g in groups}
