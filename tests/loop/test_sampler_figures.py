"""Per-sampler figures (`loop.sampler_figures`): hand-computed staleness, counts, shares and weights lag; the
simulated loop records them in every step and in the summary, and a resumed state keeps them."""

from __future__ import annotations

from pathlib import Path

import torch

from conftest import tiny_config
from heterorl.loop.sampler_figures import SamplerFigures, trained_lineage
from heterorl.rollout import RolloutGroup
from heterorl.simulated.run import execute


def _group(sampler: str, n: int, versions: list[int]) -> RolloutGroup:
    """A group of `sampler` whose one completion has a token of each version in `versions`."""
    L = len(versions)
    return RolloutGroup(
        group_id=f"{sampler}:{n}@s",
        sampler_id=sampler,
        prompt="1+1=",
        answer="2",
        prompt_ids_P=torch.tensor([4, 13, 4, 15]),
        completion_ids_GL=torch.tensor([[5] * L]),
        completion_mask_GL=torch.tensor([[1] * L]),
        behavior_logp_GL=torch.tensor([[-0.1] * L]),
        version_GL=torch.tensor([versions]),
        rewards_G=torch.tensor([1.0]),
    )


def test_staleness_counts_shares_and_lag_per_sampler_match_hand_computed_values() -> None:
    f = SamplerFigures.of(["a", "b"])
    for name in ["a", "a", "a", "b", "intruder"]:
        f.accepted(name)
    # step at learner version 5: a's groups of versions 5 and 3 (stale 0, 2), b's of version 4 (oldest token) -> 1
    f.trained([_group("a", 1, [5]), _group("a", 2, [3, 5]), _group("b", 1, [4, 5])], learner_version=5)
    record = f.record(6, {"a": 5, "b": None})
    assert record == {
        "sampler/a/accepted_total": 3.0,
        "sampler/a/trained_total": 2.0,
        "sampler/a/stale_mean": 1.0,
        "sampler/a/stale_max": 2.0,
        "sampler/a/lag": 1.0,  # learner 6 - reported 5
        "sampler/b/accepted_total": 1.0,
        "sampler/b/trained_total": 1.0,
        "sampler/b/stale_mean": 1.0,
        "sampler/b/stale_max": 1.0,
    }
    # next step at version 6: a's group of version 2 (stale 4); b now reports version 3 (lag 4)
    f.trained([_group("a", 3, [2])], learner_version=6)
    record = f.record(7, {"a": 6, "b": 3})
    assert record["sampler/a/stale_mean"] == 2.0  # (0 + 2 + 4) / 3
    assert record["sampler/a/stale_max"] == 4.0
    assert record["sampler/b/lag"] == 4.0
    summary = f.summary()
    assert summary["a"] == {
        "accepted": 3,
        "trained": 3,
        "trained_share": 0.75,
        "staleness_mean": 2.0,
        "staleness_max": 4,
        "staleness_histogram": {"0": 1, "2": 1, "4": 1},
        "lag_mean": 1.0,  # lags 1, 1
        "lag_max": 1,
    }
    assert summary["b"]["trained_share"] == 0.25
    assert summary["b"]["lag_mean"] == 4.0  # reported once
    restored = SamplerFigures.of(["a", "b"])
    restored.restore(f.to_json())
    assert restored.summary() == summary
    assert "intruder" not in summary


def test_a_sampler_nothing_was_trained_from_has_counts_but_no_staleness() -> None:
    f = SamplerFigures.of(["a", "b"])
    f.accepted("b")
    record = f.record(1, {})
    assert record == {
        "sampler/a/accepted_total": 0.0,
        "sampler/a/trained_total": 0.0,
        "sampler/b/accepted_total": 1.0,
        "sampler/b/trained_total": 0.0,
    }
    assert f.summary()["b"]["staleness_mean"] is None
    assert f.summary()["b"]["trained_share"] == 0.0


def test_the_trained_event_lists_each_group_with_its_oldest_version_and_sampler() -> None:
    groups = [_group("a", 1, [3, 5]), _group("b", 7, [4])]
    assert trained_lineage(groups) == [["a:1@s", 3, "a"], ["b:7@s", 4, "b"]]


def test_a_simulated_run_records_per_sampler_figures_that_add_up(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = tiny_config(
        tiny_model_dir, "cluster.mode=async", "cluster.samplers=[{name: a}, {name: b, tokens_per_second: 500}]"
    )
    summary = execute(cfg, tmp_path / "run", show_progress=False)
    per = summary["per_sampler"]
    assert set(per) == {"a", "b"}
    steps, B = cfg.learner.steps, cfg.learner.groups_per_step
    assert per["a"]["trained"] + per["b"]["trained"] == steps * B
    assert per["a"]["trained_share"] + per["b"]["trained_share"] == 1.0
    assert per["a"]["accepted"] + per["b"]["accepted"] == summary["net"]["accepted"]
    merged: dict[int, int] = {}
    for name in per:
        for k, v in per[name]["staleness_histogram"].items():
            merged[int(k)] = merged.get(int(k), 0) + v
    assert merged == {int(k): v for k, v in summary["staleness_histogram"].items()}  # they split the run's histogram
    assert per["a"]["trained"] > per["b"]["trained"]  # the faster sampler delivered more
