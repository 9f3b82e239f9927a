from pathlib import Path

import pytest

from heterorl.config import ConfigError, RunConfig, apply_overrides, config_to_yaml, load_config

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "configs").glob("**/*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_loads_and_round_trips(path: Path, tmp_path: Path) -> None:
    cfg = load_config(path)
    out = tmp_path / "resolved.yaml"
    out.write_text(config_to_yaml(cfg))
    assert load_config(out) == cfg


def test_shipped_configs_exist() -> None:
    assert {"demo.yaml", "smoke.yaml", "stress.yaml"} <= {p.name for p in SHIPPED}


def test_overrides_are_typed_and_dotted() -> None:
    cfg = load_config(None, ["objective.name=gepo", "objective.defensive_lam=0.25", "learner.lr=3e-4"])
    assert cfg.objective.name == "gepo"
    assert cfg.objective.defensive_lam == 0.25
    assert cfg.learner.lr == pytest.approx(3e-4)


def test_override_into_a_list_by_index() -> None:
    data = apply_overrides({"cluster": {"samplers": [{"tokens_per_second": 1.0}]}}, ["cluster.samplers.0.name=a"])
    assert data["cluster"]["samplers"][0] == {"tokens_per_second": 1.0, "name": "a"}
    with pytest.raises(ConfigError, match="valid list index"):
        apply_overrides({"cluster": {"samplers": []}}, ["cluster.samplers.3.name=a"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["learner.lr=-1"], "learner.lr"),
        (["learner.bogus=1"], "learner.bogus"),
        (["objective.name=ppo2"], "objective"),
        (["objective.name=gepo", "objective.eps_low=0.1"], "objective.gepo.eps_low"),
        (["model.hidden_size=130"], "divisible by num_heads"),
        (["sampler.top_p=1.5"], "sampler.top_p"),
        (["learner.groups_per_step=6", "learner.updates_per_batch=4"], "divisible by updates_per_batch"),
        (["cluster.eta=2"], "only apply to cluster.mode 'async'"),
        (["task.name=reversal", "task.min_length=9", "task.max_length=3"], "min_length"),
        (
            ["cluster.samplers.0.link.weights_delay.kind=lognormal", "cluster.samplers.0.link.weights_delay.lower=9"],
            "valid list",
        ),
    ],
)
def test_bad_values_fail_with_a_message_naming_the_field(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_bad_files_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "broken.yaml").write_text("learner: {lr: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "broken.yaml")
    with pytest.raises(ConfigError, match=r"dotted\.key=value"):
        load_config(None, ["learner.lr"])


def test_config_module_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, heterorl.config; assert 'torch' not in sys.modules, 'config imported torch'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_defaults_are_valid() -> None:
    assert RunConfig().objective.name == "grpo"


def test_override_of_an_aliased_yaml_node_changes_only_that_item(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("cluster:\n  samplers:\n    - link: &l {bandwidth_mbps: 10}\n    - link: *l\n")
    cfg = load_config(tmp_path / "c.yaml", ["cluster.samplers.0.link.bandwidth_mbps=99"])
    assert [s.link.bandwidth_mbps for s in cfg.cluster.samplers] == [99, 10]


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["learner.lrr=1"], "learner.lrr: unknown field; did you mean 'lr'?"),
        (["lerner.lr=1"], "lerner: unknown field; did you mean 'learner'?"),
        (
            ["objective.name=gepo", "objective.defensive_lamb=0.1"],
            "objective.gepo.defensive_lamb: unknown field; did you mean 'defensive_lam'?",
        ),
        (
            ["task.name=math", "task.path=x.jsonl", "task.eval_fractoin=0.2"],
            "task.math.eval_fractoin: unknown field; did you mean 'eval_fraction'?",
        ),
        (
            ["cluster.samplers=[{link: {weights_delay: {kind: lognormal, lowr: 3}}}]"],
            "cluster.samplers.0.link.weights_delay.lognormal.lowr: unknown field; did you mean 'lower'?",
        ),
        (["objective.name=gepoo"], "objective.name: unknown value 'gepoo'; did you mean 'gepo'?"),
        (["eval.zzz=1"], "eval.zzz: unknown field (valid: every"),
    ],
)
def test_typos_get_the_closest_valid_name(overrides: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    assert line in str(info.value)


def _numbers_without_an_upper_bound(model: type, prefix: str, seen: set[type]) -> list[str]:
    """Dotted names of the int and float fields (list and dict items included) under `model` that have no `le`
    or `lt`, walking every nested section and every variant of a union."""
    import typing

    import annotated_types
    from pydantic import BaseModel

    if model in seen:
        return []
    seen.add(model)
    found = []

    def bounded(metadata: list[object]) -> bool:
        return any(isinstance(m, annotated_types.Le | annotated_types.Lt) for m in metadata)

    def visit(tp: object, metadata: list[object], name: str) -> None:
        if typing.get_origin(tp) is typing.Annotated:
            inner, *extra = typing.get_args(tp)
            visit(inner, [*metadata, *(m for e in extra for m in getattr(e, "metadata", [e]))], name)
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            found.extend(_numbers_without_an_upper_bound(tp, f"{name}.", seen))
        elif tp in (int, float):
            if not bounded(metadata):
                found.append(name)
        else:
            for arg in typing.get_args(tp):  # unions, list items, dict keys and values
                visit(arg, metadata if typing.get_origin(tp) not in (list, dict) else [], name)

    for field_name, info in model.model_fields.items():
        visit(info.annotation, list(info.metadata), f"{prefix}{field_name}")
    return found


def test_every_config_number_has_an_upper_bound() -> None:
    """A value past its bound is a typo, not a plan (`learner.steps=10^30`): every number of every section, the
    cluster's, the network's and the live settings' included, is bounded above."""
    assert _numbers_without_an_upper_bound(RunConfig, "", set()) == []


def test_changed_settings_name_each_key_with_both_values() -> None:
    """What a refused --resume names: dotted keys with the old and new value, `live` left out, long values cut."""
    from heterorl.config import changed_settings

    before = load_config(None, ["seed=0", "live.poll_seconds=1"])
    after = load_config(None, ["seed=3", "learner.lr=0.0003", "live.poll_seconds=2", "cluster.samplers=[{}, {}]"])
    changed = changed_settings(before, after)
    assert changed[1:] == ["learner.lr (0.0001 -> 0.0003)", "seed (0 -> 3)"]
    assert changed[0].startswith("cluster.samplers ([{"), changed[0]
    assert changed[0].endswith("...)"), changed[0]
    assert changed_settings(before, before) == []
