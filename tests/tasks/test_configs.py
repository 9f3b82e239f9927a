"""The new task configs: selected by name, YAML round trip, the shared `reward` field's format check."""

from __future__ import annotations

import pytest
import yaml
from pydantic import TypeAdapter, ValidationError

from heterorl.tasks import TASKS, Problem

from ._configs import AdditionTaskConfig, GymTaskConfig, MathTaskConfig, ReversalTaskConfig, TaskConfig

CONFIGS = [
    AdditionTaskConfig(reward="pkg.mod:fn"),
    ReversalTaskConfig(),
    MathTaskConfig(path="data/train.jsonl", eval_path="data/test.parquet", reward="m:f"),
    GymTaskConfig(dataset="chain_sum", dataset_options={"min_terms": 2, "max_terms": 4}, answer_tag="answer"),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_every_task_config_round_trips_through_yaml_and_has_a_task(cfg) -> None:
    data = yaml.safe_load(yaml.safe_dump(cfg.model_dump()))
    assert TypeAdapter(TaskConfig).validate_python(data) == cfg
    assert cfg.name in TASKS


@pytest.mark.parametrize("spec", ["nocolon", "a:b:c", "a.:f", "1mod:f", "mod:f()", ""])
def test_reward_paths_are_checked_when_parsing(spec: str) -> None:
    with pytest.raises(ValidationError, match="reward"):
        AdditionTaskConfig(reward=spec)


def test_problem_extras_take_no_part_in_equality() -> None:
    a, b = Problem("p", "1", info={"x": [1]}), Problem("p", "1", info={"x": [2]})
    assert a == b
    assert hash(a) == hash(b)
    assert "info" not in repr(a)
