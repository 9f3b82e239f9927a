"""Objective registry: name -> loss function, with the config classes of `heterorl.config.OBJECTIVE_CONFIGS`.

A new objective is one module with its loss function, one config class in `heterorl.config`, and one line here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from heterorl.config import OBJECTIVE_CONFIGS
from heterorl.objectives.base import LossFn, Objective
from heterorl.objectives.cispo import cispo
from heterorl.objectives.decoupled_ppo import decoupled_ppo
from heterorl.objectives.dg import dg
from heterorl.objectives.gepo import gepo
from heterorl.objectives.grpo import grpo
from heterorl.objectives.gspo import gspo
from heterorl.objectives.pg import is_pg, pg


@dataclass(frozen=True)
class ObjectiveSpec:
    """How to build one objective: its loss function and whether it always needs `prox_logp` (any objective with
    a behaviour-weight cap needs it too)."""

    loss_fn: LossFn
    needs_prox_logp: bool = False


OBJECTIVES: dict[str, ObjectiveSpec] = {
    "grpo": ObjectiveSpec(grpo),
    "gspo": ObjectiveSpec(gspo),
    "gepo": ObjectiveSpec(gepo),
    "dg": ObjectiveSpec(dg),
    "decoupled_ppo": ObjectiveSpec(decoupled_ppo, needs_prox_logp=True),
    "cispo": ObjectiveSpec(cispo),
    "pg": ObjectiveSpec(pg),
    "is_pg": ObjectiveSpec(is_pg),
}


def _valid_names() -> list[str]:
    return sorted(OBJECTIVES.keys() & OBJECTIVE_CONFIGS.keys())


def hyperparameter_names(name: str) -> list[str]:
    """The hyperparameters `make_objective(name, ...)` accepts (the config fields except `name`)."""
    return [f for f in OBJECTIVE_CONFIGS[name].model_fields if f != "name"]


def make_objective(name: str, **hyperparameters: Any) -> Objective:
    """Build an objective by name; hyperparameters are validated by its pydantic config (defaults live there).

    Raises ValueError for an unknown name (listing the valid ones) or an unknown / invalid hyperparameter
    (listing the valid hyperparameters).
    """
    if name not in _valid_names():
        raise ValueError(f"unknown objective {name!r}; valid objectives: {', '.join(_valid_names())}")
    try:
        cfg = OBJECTIVE_CONFIGS[name].model_validate({"name": name, **hyperparameters})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors())
        raise ValueError(
            f"invalid hyperparameters for objective {name!r}: {problems}. "
            f"Valid hyperparameters: {', '.join(hyperparameter_names(name))}"
        ) from None
    return objective_from_config(cfg)


def objective_from_config(cfg: BaseModel) -> Objective:
    """Build the objective described by a ready config object (e.g. `RunConfig.objective`)."""
    name = getattr(cfg, "name", None)
    if name not in _valid_names():
        raise ValueError(f"unknown objective {name!r}; valid objectives: {', '.join(_valid_names())}")
    if not isinstance(cfg, OBJECTIVE_CONFIGS[name]):
        raise TypeError(f"config for {name!r} must be a {OBJECTIVE_CONFIGS[name].__name__}, got {type(cfg).__name__}")
    spec = OBJECTIVES[name]
    needs_prox = spec.needs_prox_logp or getattr(cfg, "cap_mode", "none") != "none"
    return Objective(name=name, config=cfg, loss_fn=spec.loss_fn, needs_prox_logp=needs_prox)
