"""Launch mistakes end in one line that says what to do."""

from __future__ import annotations

import sys

import pytest

from heterorl.config import ConfigError, load_config
from heterorl.launch.errors import LaunchError
from heterorl.launch.ray import INSTALL_HINT, run_ray


def test_ray_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if it were not installed
    with pytest.raises(LaunchError, match=r"pip install 'heterorl\[ray\]'") as err:
        run_ray(load_config(None, []), tmp_path / "run", show_progress=False)
    assert str(err.value) == INSTALL_HINT


def test_ray_sampler_resources_match_the_sampler_nodes() -> None:
    two = "cluster.samplers=[{name: a}, {name: b}]"
    cfg = load_config(None, [two, "ray.samplers=[{num_cpus: 2}, {num_gpus: 1, resources: {region_eu: 1}}]"])
    assert cfg.ray.sampler_resources(1).resources == {"region_eu": 1}
    assert load_config(None, [two, "ray.samplers=[{num_cpus: 2}]"]).ray.sampler_resources(1).num_cpus == 2
    with pytest.raises(ConfigError, match=r"ray\.samplers has 3 entries for 2 sampler nodes"):
        load_config(None, [two, "ray.samplers=[{}, {}, {}]"])
    with pytest.raises(ConfigError, match=r"ray\.samplers\.0\.resources\.region: Input should be greater than 0"):
        load_config(None, ["ray.samplers=[{resources: {region: 0}}]"])
    with pytest.raises(ConfigError, match=r"parallel\.strategy"):
        load_config(None, ["parallel.strategy=zero3"])
