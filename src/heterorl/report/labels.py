"""Naming report groups by what tells them apart, briefly enough for a plot legend and a terminal table.

Runs are compared on the config keys whose values really differ, after three reductions:

- A section chosen by a discriminator (`objective.name`, a delay model's `kind`) owns its fields: switching the
  objective from grpo to gepo changes its whole field set, which is one difference (`objective.name`), not
  thirty. An owned field counts only where it varies between runs that share the discriminator's value.
- A list that differs in length is told apart by its `count`; the extra items' fields are not listed.
- Keys that differ only by a list index and hold the same value in every run (the same delay on every
  sampler's link) are one key, written with `*` (`cluster.samplers.*.link.weights_delay.seconds`).

A label folds a discriminated section's fields into its value: `objective=grpo(eps_high=0.28)`.
"""

from __future__ import annotations

import functools
import json
import types
import typing
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from heterorl.config import RunConfig
from heterorl.naming import short_keys

MISSING = "unset"  # how a key absent from a run's config is shown (another objective or delay model, say)


def canonical(value: Any) -> str:
    """A value as a comparable string (dicts with sorted keys)."""
    return json.dumps(value, sort_keys=True, default=str)


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


def differing_keys(configs: list[dict[str, Any]], exclude: frozenset[str] = frozenset({"seed"})) -> list[str]:
    """Keys whose value (or presence) differs across the flattened configs, in config order."""
    keys: dict[str, None] = {}
    for config in configs:
        keys.update(dict.fromkeys(config))
    return [k for k in keys if k not in exclude and len({canonical(c.get(k, MISSING)) for c in configs}) > 1]


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The config models inside an annotation (`X | None`, `list[X]`, `Annotated[X, ...]`, a union of models)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    if typing.get_origin(annotation) is typing.Annotated:
        return _models(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, list):
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    return []


def _tag_field(members: list[type[BaseModel]]) -> str | None:
    """The field that tells the members of a union of configs apart: `name` or `kind`, a literal in each."""
    if len(members) < 2:
        return None
    for tag in ("name", "kind"):
        fields = [m.model_fields.get(tag) for m in members]
        if all(f is not None and typing.get_origin(f.annotation) is typing.Literal for f in fields):
            return tag
    return None


def _walk(model: type[BaseModel], prefix: str, found: set[str]) -> None:
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        inner = f"{key}.*." if typing.get_origin(info.annotation) is list else f"{key}."
        members = _models(info.annotation)
        tag = _tag_field(members)
        if tag is not None:
            found.add(f"{inner}{tag}")
        for sub in members:
            _walk(sub, inner, found)


@functools.cache
def discriminator_patterns() -> frozenset[str]:
    """The config keys that choose an implementation (`objective.name`, `task.name`, every link's delay `kind`),
    as patterns with `*` for list indices: the literal `name` / `kind` of RunConfig's unions of config models
    (however pydantic is told to discriminate them)."""
    found: set[str] = set()
    _walk(RunConfig, "", found)
    return frozenset(found)


def is_discriminator(key: str) -> bool:
    return _pattern(key) in discriminator_patterns()


def discriminator(key: str, keys: list[str]) -> str | None:
    """The nearest discriminator above `key` (its section's `name` / `kind`) that is among `keys`."""
    parts = key.split(".")
    for n in range(len(parts) - 1, 0, -1):
        for candidate in keys:
            if candidate != key and is_discriminator(candidate) and candidate.rsplit(".", 1)[0] == ".".join(parts[:n]):
                return candidate
    return None


def _explained_by_count(key: str, keys: list[str], configs: list[dict[str, Any]]) -> bool:
    """`key` is a field of a list item that some runs lack, and the list's `count` differs."""
    parts = key.split(".")
    return any(
        part.isdigit() and ".".join([*parts[:i], "count"]) in keys and any(key not in c for c in configs)
        for i, part in enumerate(parts)
    )


def _varies_within(key: str, disc: str | None, configs: list[dict[str, Any]]) -> bool:
    """`key` takes more than one value among the runs that have it and share some value of `disc`."""
    values: dict[str, set[str]] = {}
    for c in configs:
        if key in c:
            values.setdefault(canonical(c.get(disc)) if disc else "", set()).add(canonical(c[key]))
    return any(len(v) > 1 for v in values.values())


def comparison_keys(configs: list[dict[str, Any]]) -> list[str]:
    """The keys the runs are compared on: `differing_keys` less the fields owned by a differing discriminator
    that never vary under one of its values, and the fields of list items counted by a differing `count`."""
    keys = differing_keys(configs)
    keys = [k for k in keys if not _explained_by_count(k, keys, configs)]
    return [k for k in keys if (d := discriminator(k, keys)) is None or _varies_within(k, d, configs)]


def _pattern(key: str) -> str:
    return ".".join("*" if part.isdigit() else part for part in key.split("."))


def merge_siblings(keys: list[str], configs: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """Keys that differ only by list indices and agree in every config become one `*` key. Returns the keys and
    the configs restricted to them (a merged key takes its members' common value)."""
    members: dict[str, list[str]] = {}
    for k in keys:
        members.setdefault(_pattern(k), []).append(k)
    merged: dict[str, list[str]] = {}  # key shown -> the config keys it stands for
    for k in keys:
        siblings = members[_pattern(k)]
        same = len(siblings) > 1 and all(len({canonical(c.get(s, MISSING)) for s in siblings}) == 1 for c in configs)
        merged.setdefault(_pattern(k) if same else k, siblings if same else [k])
    restricted = [{key: c[group[0]] for key, group in merged.items() if group[0] in c} for c in configs]
    return list(merged), restricted


def naming_keys(configs: list[dict[str, Any]], keys: list[str]) -> list[list[str]]:
    """For each config, the keys worth naming it by: the keys it has that take more than one value among the
    configs sharing its discriminator values. So `objective.name=gepo` names a group without the fields GEPO
    sets differently from GRPO, while a GRPO field varied between GRPO runs still shows."""
    disc = {k: discriminator(k, keys) for k in keys}

    def varies(key: str, config: dict[str, Any]) -> bool:
        d = disc[key]
        peers = [c for c in configs if key in c and (d is None or canonical(c.get(d)) == canonical(config.get(d)))]
        return len({canonical(c[key]) for c in peers}) > 1

    return [[k for k in keys if k in config and varies(k, config)] for config in configs]


def _section(disc: str) -> str:
    return disc.rsplit(".", 1)[0]


def display_names(keys: list[str]) -> dict[str, str]:
    """Short names (`short_keys`) of `keys` and of the sections their discriminators choose, made explicit where
    the shortest unique suffix would mislead: a field of a discriminated section keeps the section's name
    (`weights_delay.seconds`, `objective.eps_high`, not `seconds`), and a field of one list item keeps the item's
    index (`samplers.0.tokens_per_second`; a `*` key stands for every item and needs none)."""
    shown = list(dict.fromkeys([*keys, *(_section(k) for k in keys if is_discriminator(k))]))
    short = short_keys(shown)
    sections = {_section(p) for p in discriminator_patterns()}
    names = {}
    for key in shown:
        parts = key.split(".")
        index = max((i for i, p in enumerate(parts) if p.isdigit()), default=None)
        name = short[key]
        if index is not None and len(name.split(".")) < len(parts) - index + 1:
            name = ".".join(parts[max(index - 1, 0) :])  # from the list's name: `samplers.0.<field>`
        elif "." not in name and len(parts) > 1 and _pattern(".".join(parts[:-1])) in sections:
            name = f"{next(p for p in reversed(parts[:-1]) if p != '*')}.{name}"
        names[key] = name
    return names


def label_text(label: dict[str, Any], keys: list[str], names: dict[str, str]) -> str:
    """`objective=grpo(eps_high=0.28), max_staleness=4`: a discriminator is shown as its section's name with the
    section's fields from the label folded into its value; every other key as `short=value` (`names`: from
    `display_names`)."""
    folded: dict[str, list[str]] = {}
    for key in label:
        d = discriminator(key, keys)
        if d is not None and d in label:
            folded.setdefault(d, []).append(key)
    inside = {k for children in folded.values() for k in children}
    parts = []
    for key, value in label.items():
        if key in inside:
            continue
        if is_discriminator(key):
            section = _section(key)
            children = ", ".join(f"{k[len(section) + 1 :]}={format_value(label[k])}" for k in folded.get(key, []))
            parts.append(f"{names[section]}={format_value(value)}" + (f"({children})" if children else ""))
        else:
            parts.append(f"{names[key]}={format_value(value)}")
    return ", ".join(parts)


MIN_GROUPS_TO_OMIT = 3  # with two groups every value is informative ("mode=sync" vs "mode=async")


def common_values(labels: list[dict[str, Any]]) -> dict[str, Any]:
    """Each key's strict mode over the labels: the value more groups have than any other (ties: none). With at
    least MIN_GROUPS_TO_OMIT groups, a label may leave such a value out (a grid's default, e.g. no friction).
    Discriminators are never left out: the objective or delay model is what a reader looks for first."""
    if len(labels) < MIN_GROUPS_TO_OMIT:
        return {}
    counts: dict[str, dict[str, tuple[int, Any]]] = {}
    for label in labels:
        for key, value in label.items():
            if is_discriminator(key):
                continue
            n, _ = counts.setdefault(key, {}).get(canonical(value), (0, value))
            counts[key][canonical(value)] = (n + 1, value)
    modes = {}
    for key, by_value in counts.items():
        ranked = sorted(by_value.values(), key=lambda nv: -nv[0])
        if len(ranked) > 1 and ranked[0][0] > ranked[1][0]:
            modes[key] = ranked[0][1]
    return modes


@dataclass
class Naming:
    """How a set of groups is told apart: the keys compared on; per group its label (every key naming it) and
    its name (the label as text, leaving out `unlisted` values); `unlisted`: the common values left out."""

    keys: list[str]
    labels: list[dict[str, Any]]
    names: list[str]
    unlisted: str = ""


def _first_discriminators(label: dict[str, Any]) -> dict[str, Any]:
    """The label with discriminated sections (objective, delay model) first: they say the most."""
    return dict(sorted(label.items(), key=lambda kv: not is_discriminator(kv[0])))


def group_labels(configs: list[dict[str, Any]], group_by: list[str] | None = None) -> Naming:
    """The naming of groups with these flattened configs (seed excluded). With `group_by`, those keys alone
    name the groups; otherwise the compared keys worth naming each group by, less common values."""
    if group_by is not None:
        labels = [{k: c.get(k, MISSING) for k in group_by} for c in configs]
        names = display_names(group_by)
        return Naming(group_by, labels, [label_text(lab, group_by, names) for lab in labels])
    keys, merged = merge_siblings(comparison_keys(configs), configs)
    named = naming_keys(merged, keys)
    if len({tuple((k, canonical(c[k])) for k in n) for c, n in zip(merged, named, strict=True)}) < len(configs):
        named = [[k for k in keys if k in c] for c in merged]  # fall back to every compared key
    labels = [_first_discriminators({k: c[k] for k in n}) for c, n in zip(merged, named, strict=True)]
    common = common_values(labels)
    shown = [{k: v for k, v in lab.items() if canonical(v) != canonical(common.get(k, MISSING))} for lab in labels]
    if len({canonical(s) for s in shown}) < len(shown):
        # two labels that differ only by a key one of them lacks, at its common value: leave nothing out
        shown, common = labels, {}
    names = display_names(keys)
    # a group with every value the common one is named in full rather than by nothing
    texts = [label_text(s if s else lab, keys, names) for s, lab in zip(shown, labels, strict=True)]
    left_out = [k for lab, s in zip(labels, shown, strict=True) if s for k in lab if k not in s]
    unlisted = {k: v for k, v in common.items() if k in left_out}
    return Naming(keys, labels, texts, label_text(unlisted, keys, names))
