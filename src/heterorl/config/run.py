"""The whole run: every section composed into `RunConfig`, and its loading from YAML plus `--set` overrides."""

from __future__ import annotations

import difflib
import json
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from heterorl.config.base import MAX_SEED, ConfigError, Strict
from heterorl.config.cluster import ClusterConfig, LiveConfig, WeightsConfig
from heterorl.config.launch import ParallelConfig, RayConfig
from heterorl.config.model import ModelConfig
from heterorl.config.objectives import GRPOConfig, ObjectiveConfig
from heterorl.config.tasks import AdditionTaskConfig, TaskConfig
from heterorl.config.training import (
    CheckpointConfig,
    EvalConfig,
    LearnerConfig,
    MetricsConfig,
    PretrainConfig,
    RuntimeConfig,
    SamplerConfig,
)
from heterorl.config.transport import TransportConfig
from heterorl.config.trust import AdversaryConfig, TrustConfig
from heterorl.config.yaml_io import load_yaml_text, read_yaml_mapping


class RunConfig(Strict):
    """Everything a run needs; written, resolved, into the run directory."""

    seed: int = Field(0, ge=0, le=MAX_SEED, description="Seed of every random stream in the run.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=AdditionTaskConfig)
    pretrain: PretrainConfig = Field(default_factory=PretrainConfig)
    sampler: SamplerConfig = Field(default_factory=SamplerConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    objective: ObjectiveConfig = Field(default_factory=GRPOConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)
    live: LiveConfig = Field(default_factory=LiveConfig)
    transport: TransportConfig = Field(default_factory=TransportConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    trust: TrustConfig = Field(default_factory=TrustConfig)
    adversaries: dict[str, AdversaryConfig] = Field(
        default_factory=dict,
        description="Simulator experiments: sampler node name -> how that sampler lies (heterorl.adversaries).",
    )

    @model_validator(mode="after")
    def _eta_needs_async(self) -> RunConfig:
        if self.cluster.mode == "sync" and (self.cluster.eta or self.cluster.max_staleness):
            raise ValueError("cluster.eta / cluster.max_staleness only apply to cluster.mode 'async'")
        return self

    @model_validator(mode="after")
    def _modelled_over_links(self) -> RunConfig:
        if self.cluster.modelled is not None and self.transport.weights == "store":
            raise ValueError(
                "cluster.modelled sizes the weight updates on the simulated links; with transport.weights: store "
                "they would travel as the small model's objects: use transport.weights: http for a plan"
            )
        return self

    @model_validator(mode="after")
    def _adversaries_are_nodes(self) -> RunConfig:
        names = set(self.cluster.sampler_names())
        unknown = sorted(set(self.adversaries) - names)
        if unknown:
            raise ValueError(f"adversaries {unknown} are not sampler nodes (cluster.samplers: {sorted(names)})")
        return self

    @model_validator(mode="after")
    def _frictions_are_not_checked(self) -> RunConfig:
        f, t = self.sampler.frictions, self.trust
        injected = f.actor_bug or f.rare_discovery or f.reward_corruption or f.logit_noise
        if injected and (t.recheck_rewards or t.verify.fraction > 0):
            raise ValueError(
                "sampler.frictions inject faults that the learner's trust checks refuse (corrupted rewards, noisy or "
                "replaced tokens): set trust.recheck_rewards: false and trust.verify.fraction: 0 to study frictions"
            )
        return self

    @model_validator(mode="after")
    def _ray_sampler_resources(self) -> RunConfig:
        n, nodes = len(self.ray.samplers), len(self.cluster.samplers)
        if n > 1 and n != nodes:
            raise ValueError(f"ray.samplers has {n} entries for {nodes} sampler nodes (give 0, 1 or {nodes})")
        return self


# --- loading
def _unwrap(annotation: Any) -> list[Any]:
    """The alternatives of an annotation: `X | None` -> [X], a union of models -> its members."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [alt for arg in typing.get_args(annotation) if arg is not type(None) for alt in _unwrap(arg)]
    return [annotation]


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _tag(model: type[BaseModel]) -> set[Any]:
    """The literal `name` / `kind` values a member of a discriminated union answers to."""
    return {model.model_fields[f].default for f in ("name", "kind") if f in model.model_fields}


def _candidates(loc: tuple[int | str, ...]) -> list[Any]:
    """The annotations a validation error's location may point at: one model, or a union's members.

    Locations hold field names, list indices and, inside a discriminated union, the chosen member's tag
    (`("task", "math", "eval_fraction")`)."""
    current: list[Any] = [RunConfig]
    for part in loc:
        step: list[Any] = []
        for annotation in current:
            if _is_model(annotation) and isinstance(part, str) and part in annotation.model_fields:
                step += _unwrap(annotation.model_fields[part].annotation)
            elif typing.get_origin(annotation) is list and isinstance(part, int):
                step += _unwrap(typing.get_args(annotation)[0])
        if not step:  # a union's tag: keep the member it names
            step = [a for a in current if _is_model(a) and part in _tag(a)]
        current = step
    return current


def model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The config section a validation error's location points into (None if it is not one section)."""
    models = [a for a in _candidates(loc) if _is_model(a)]
    return models[0] if len(models) == 1 else None


def _tag_field(loc: tuple[int | str, ...]) -> str:
    """The field (`name` / `kind`) that chooses among the union of sections at `loc`."""
    models = [a for a in _candidates(loc) if _is_model(a)]
    return next((f for f in ("name", "kind") if models and all(f in m.model_fields for m in models)), "name")


def _suggestion(word: str, choices: list[str]) -> str:
    """`; did you mean 'lr'?` for the closest choice, or the valid choices when none is close."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f" (valid: {', '.join(choices)})"


def _message(e: Any) -> str:
    """pydantic's message, with the closest valid name for a misspelt field or objective/task/delay name."""
    if e["type"] == "extra_forbidden":
        model = model_at(tuple(e["loc"][:-1]))
        if model is not None:
            return "unknown field" + _suggestion(str(e["loc"][-1]), list(model.model_fields))
    if e["type"] == "union_tag_invalid":
        tags = [t.strip().strip("'") for t in e["ctx"]["expected_tags"].split(",")]
        return f"unknown value {e['ctx']['tag']!r}" + _suggestion(str(e["ctx"]["tag"]), tags)
    return e["msg"]


def _location(e: Any) -> str:
    """The dotted location; an unknown union tag is reported at the discriminator field (`objective.name`)."""
    loc = [str(p) for p in e["loc"]]
    if e["type"] == "union_tag_invalid":  # the discriminator may be a field name or a function: name the field
        loc.append(_tag_field(tuple(e["loc"])))
    return ".".join(loc) or "<root>"


def _format_error(err: ValidationError) -> str:
    """`invalid config: loc: message` for one error (the usual case); one indented line per error for several."""
    lines = [f"{_location(e)}: {_message(e).removeprefix('Value error, ')}" for e in err.errors()]
    if len(lines) == 1:
        return f"invalid config: {lines[0]}"
    return "invalid config:\n" + "\n".join(f"  {line}" for line in lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a","b","c"], value); the value is parsed as YAML (numbers, bools, lists, null)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like dotted.key=value")
    key, raw = item.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key")
    value = load_yaml_text(raw, f"override {item!r}") if raw != "" else ""
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted overrides to a raw config dict; list items are addressed by index (`cluster.samplers.0.x`)."""
    for item in overrides:
        path, value = parse_override(item)
        node: Any = data
        for i, part in enumerate(path[:-1]):
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"override {item!r}: {'.'.join(path[: i + 1])} is not a valid list index")
                node = node[int(part)]
            else:
                node = node.setdefault(part, {})
            if not isinstance(node, dict | list):
                raise ConfigError(f"override {item!r}: {'.'.join(path[: i + 1])} is not a section")
        last = path[-1]
        if isinstance(node, list):
            if not last.isdigit() or int(last) >= len(node):
                raise ConfigError(f"override {item!r}: {last!r} is not a valid list index")
            node[int(last)] = value
        else:
            node[last] = value
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML config (or the defaults), apply `--set` overrides, validate; errors name the field."""
    data: dict[str, Any] = {}
    if path is not None:
        data = read_yaml_mapping(path)  # aliases expanded under a bound, each its own copy
    return validate_config(apply_overrides(data, overrides or []))


def validate_config(data: dict[str, Any]) -> RunConfig:
    """A RunConfig from raw data (parsed YAML, a dict); errors name the field."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc)) from None


def config_to_yaml(cfg: BaseModel) -> str:
    """The resolved config as YAML (round-trips through `load_config`)."""
    return yaml.safe_dump(json.loads(cfg.model_dump_json()), sort_keys=False)


def changed_settings(before: RunConfig, after: RunConfig, ignore: tuple[str, ...] = ("live",)) -> list[str]:
    """The settings that differ between two configs, as `dotted.key (old -> new)`, sorted, sections in `ignore`
    left out: what a refused `--resume` names."""
    old, new = _flat(before.model_dump(mode="json")), _flat(after.model_dump(mode="json"))
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k.split(".")[0] not in ignore)
    return [f"{k} ({_short(old.get(k))} -> {_short(new.get(k))})" for k in keys]


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (lists stay whole values)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."
