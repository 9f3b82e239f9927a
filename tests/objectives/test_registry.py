"""make_objective / objective_from_config and their error messages."""

import pytest
import torch

from heterorl.config import (
    OBJECTIVE_CONFIGS,
    ConfigError,
    DecoupledPPOConfig,
    GEPOConfig,
    GRPOConfig,
    RunConfig,
    load_config,
)
from heterorl.objectives import OBJECTIVES, hyperparameter_names, make_objective, objective_from_config


def test_registry_covers_every_objective_config():
    assert set(OBJECTIVES) == set(OBJECTIVE_CONFIGS)


@pytest.mark.parametrize("name", sorted(OBJECTIVE_CONFIGS))
def test_defaults_come_from_the_config(name: str):
    obj = make_objective(name)
    assert obj.name == name
    assert obj.config == OBJECTIVE_CONFIGS[name]()
    assert obj.normalize_advantages == OBJECTIVE_CONFIGS[name]().normalize_advantages  # type: ignore[attr-defined]
    assert obj.needs_prox_logp == (name == "decoupled_ppo")


def test_hyperparameters_are_applied():
    obj = make_objective("gepo", eps=0.3, defensive_lam=0.1, normalize_advantages=True)
    assert obj.config == GEPOConfig(eps=0.3, defensive_lam=0.1, normalize_advantages=True)
    assert obj.normalize_advantages


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown objective 'ppo'") as err:
        make_objective("ppo")
    for name in OBJECTIVE_CONFIGS:
        assert name in str(err.value)


def test_unknown_hyperparameter_lists_valid_ones():
    with pytest.raises(ValueError, match="epsilon") as err:
        make_objective("grpo", epsilon=0.2)
    msg = str(err.value)
    assert "invalid hyperparameters for objective 'grpo'" in msg
    for field in ("eps_low", "eps_high", "aggregation", "normalize_advantages"):
        assert field in msg
    assert hyperparameter_names("grpo") == [
        *("ref_kl_beta", "ref_kl_estimator", "mask_truncated", "overlong_cache", "overlong_penalty_factor"),
        *("cap_mode", "cap", "cap_low", "cap_level"),
        *("eps_low", "eps_high", "dual_clip", "aggregation", "normalize_advantages"),
    ]


@pytest.mark.parametrize(
    ("name", "hp"),
    [
        ("grpo", {"eps_low": -0.1}),
        ("dg", {"aggregation": "sum"}),
        ("decoupled_ppo", {"cap": 0}),
        ("gepo", {"eps": 2}),
        ("gspo", {"cap_mode": "tis"}),
        ("grpo", {"cap_level": "group"}),
        ("cispo", {"eps_low": 1.5}),
        ("pg", {"ref_kl_beta": -1}),
        ("dg", {"overlong_cache": -1}),
        ("grpo", {"dual_clip": 0.5}),
    ],
)
def test_invalid_value_is_a_value_error(name: str, hp: dict):
    with pytest.raises(ValueError, match=f"invalid hyperparameters for objective '{name}'.*{next(iter(hp))}"):
        make_objective(name, **hp)


def test_objective_from_config():
    cfg = DecoupledPPOConfig(cap=3.0, cap_mode="clamp")
    obj = objective_from_config(cfg)
    assert obj.name == "decoupled_ppo"
    assert obj.config is cfg
    assert obj.needs_prox_logp
    assert objective_from_config(RunConfig().objective).name == "grpo"


def test_objective_from_wrong_config():
    with pytest.raises(ValueError, match="unknown objective"):
        objective_from_config(RunConfig().model)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"behavior_logp": torch.zeros(2, 4)}, "behavior_logp has shape"),
        ({"mask": torch.ones(3)}, "mask has shape"),
        ({"advantages": torch.zeros(2, 1)}, "advantages must be"),
        ({"group_index": torch.zeros(2)}, "group_index must be an integer"),
        ({"mask": torch.zeros(2, 3)}, "no completion tokens"),
    ],
)
def test_input_validation(kwargs: dict, match: str):
    args = {
        "logp": torch.zeros(2, 3),
        "behavior_logp": torch.zeros(2, 3),
        "mask": torch.ones(2, 3),
        "advantages": torch.zeros(2),
        "group_index": torch.zeros(2, dtype=torch.long),
    }
    with pytest.raises(ValueError, match=match):
        make_objective("grpo")(**{**args, **kwargs})


def test_objective_is_frozen():
    obj = make_objective("grpo")
    with pytest.raises(AttributeError):
        obj.name = "pg"  # type: ignore[misc]
    assert isinstance(obj.config, GRPOConfig)


@pytest.mark.parametrize(
    ("hp", "match"),
    [
        ({"cap_mode": "clamp", "cap_low": 0.5}, "cap_low only applies to cap_mode 'mask'"),
        ({"cap_mode": "mask", "cap": 2.0, "cap_low": 2.0}, "must be below cap"),
    ],
)
def test_cap_bounds_are_checked(hp: dict, match: str):
    with pytest.raises(ValueError, match=match):
        make_objective("grpo", **hp)


def test_cap_lower_bound():
    assert GRPOConfig(cap_mode="mask", cap=4.0).cap_lower_bound == 0.25  # verl's default: 1 / cap
    assert GRPOConfig(cap_mode="mask", cap=4.0, cap_low=0.0).cap_lower_bound == 0.0
    assert GRPOConfig(cap_mode="clamp", cap=4.0).cap_lower_bound == 0.0
    assert DecoupledPPOConfig().cap_lower_bound == 0.0  # AReaL: the upper side only
    assert DecoupledPPOConfig(cap_mode="clamp").cap_lower_bound == 0.0


def test_options_decide_the_extra_forward_passes():
    assert make_objective("grpo", cap_mode="clamp").needs_prox_logp
    assert make_objective("cispo", cap_mode="mask").needs_prox_logp
    assert not make_objective("cispo").needs_prox_logp
    assert make_objective("dg", ref_kl_beta=0.01).needs_ref_logp
    assert not make_objective("decoupled_ppo").needs_ref_logp
    assert make_objective("gspo").aggregation == "seq_mean_token_mean"
    assert make_objective("cispo").aggregation == "token_mean"


def test_config_keeps_the_objective_name_first():
    assert next(iter(GRPOConfig.model_fields)) == "name"
    assert next(iter(RunConfig().objective.model_dump())) == "name"


@pytest.mark.parametrize("name", sorted(OBJECTIVE_CONFIGS))
def test_run_config_parses_every_objective_by_name(name: str):
    assert type(RunConfig(objective={"name": name}).objective) is OBJECTIVE_CONFIGS[name]


def test_objective_options_without_a_name_apply_to_the_default_objective():
    cfg = load_config(None, ["objective.ref_kl_beta=0.04", "objective.mask_truncated=true"])
    assert cfg.objective == GRPOConfig(ref_kl_beta=0.04, mask_truncated=True)
    with pytest.raises(ConfigError, match=r"objective\.name: unknown value 'ppo2' \(valid: grpo, gspo, "):
        load_config(None, ["objective.name=ppo2"])
