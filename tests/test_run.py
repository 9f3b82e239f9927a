"""End to end: the smoke config trains, writes a complete run directory, and the CLI reports it."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conftest import REPO, smoke_config
from heterorl.cli import app
from heterorl.config import load_config
from heterorl.metrics import read_metrics
from heterorl.simulated.run import execute


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, dict]:
    import os

    os.environ["HETERORL_CACHE"] = str(cache_dir)
    run_dir = tmp_path_factory.mktemp("smoke-run")
    return run_dir, execute(smoke_config(), run_dir, show_progress=False)


def test_smoke_run_improves_reward(smoke_run: tuple[Path, dict]) -> None:
    _, summary = smoke_run
    assert summary["reward_last"] > summary["reward_first"] + 0.03
    assert summary["accuracy_best"] >= summary["accuracy_initial"]
    assert 0.2 <= summary["accuracy_initial"] <= 0.7  # the warm start is only partly competent


def test_smoke_run_with_patch_sync_is_identical_to_full_sync(smoke_run: tuple[Path, dict], tmp_path: Path) -> None:
    """The smoke config ships weights as full snapshots; with PULSE patches every training metric is the same."""
    run_dir, _ = smoke_run
    execute(smoke_config("weights.codec=pulse"), tmp_path / "pulse", show_progress=False)

    def training(path: Path) -> list[dict]:
        records = read_metrics(path / "metrics.jsonl")
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "sync/"))} for r in records]

    assert training(tmp_path / "pulse") == training(run_dir)
    sent = [r["sync/bytes"] for r in read_metrics(tmp_path / "pulse" / "metrics.jsonl") if r["kind"] == "train"]
    full = [r["sync/bytes"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert sum(sent[1:]) < sum(full[1:]) / 2  # after the first snapshot, patches are much smaller


def test_run_directory_is_complete(smoke_run: tuple[Path, dict]) -> None:
    run_dir, summary = smoke_run
    assert load_config(run_dir / "config.yaml") == smoke_config()
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in train] == list(range(1, 31))
    assert [r["step"] for r in evals] == [0, 10, 20, 30]
    for key in ("reward/mean", "obj/loss", "obj/kl_k3", "perf/tokens", "time/clock", "time/wall", "opt/lr"):
        assert all(key in r for r in train), key
    assert evals[0]["eval/accuracy"] == summary["accuracy_initial"]
    assert evals[-1]["eval/accuracy"] == summary["accuracy_final"]
    on_disk = json.loads((run_dir / "summary.json").read_text())
    for key in ("accuracy_initial", "accuracy_final", "steps", "wall_seconds"):
        assert key in on_disk
    assert on_disk["steps"] == 30


def test_final_checkpoint_loads_in_transformers_and_matches_the_summary(smoke_run: tuple[Path, dict]) -> None:
    run_dir, summary = smoke_run
    result = CliRunner().invoke(
        app, ["eval", str(run_dir / "checkpoint"), "--config", str(REPO / "configs/smoke.yaml")]
    )
    assert result.exit_code == 0, result.output
    assert f"{summary['accuracy_final']:.1%}" in result.output


def test_cli_run_prints_a_summary(tmp_path: Path) -> None:
    overrides = ["--set", "learner.steps=2", "--set", "eval.every=1"]
    result = CliRunner().invoke(
        app, ["run", str(REPO / "configs/smoke.yaml"), *overrides, "--run-dir", str(tmp_path / "r"), "--quiet"]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / "summary.json").is_file()


def test_cli_rejects_a_bad_config_naming_the_field(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["run", str(REPO / "configs/smoke.yaml"), "--set", "learner.lr=0"])
    assert result.exit_code == 2
    assert "learner.lr" in result.output


def test_base_model_is_cached(tmp_path: Path) -> None:
    from heterorl.pretrain import ensure_base_model

    first = ensure_base_model(smoke_config(), show_progress=False)
    second = ensure_base_model(smoke_config(), show_progress=False)
    assert second.cached
    assert second.path == first.path
    assert (Path(second.path) / "tokenizer.json").is_file()


def test_optional_sinks_are_written_by_the_run(tiny_model_dir: Path, tmp_path: Path, monkeypatch) -> None:
    from conftest import tiny_config

    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_config(tiny_model_dir, "learner.steps=2", "metrics.tensorboard=true", "metrics.wandb=true")
    execute(cfg, tmp_path / "run", show_progress=False)
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*"))


def test_pretrain_seed_shares_one_base_model_across_run_seeds(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from heterorl.pretrain import base_model_key, pretrain

    def key(*overrides: str) -> str:
        return base_model_key(smoke_config(*overrides))

    assert key("seed=1", "pretrain.seed=5") == key("seed=2", "pretrain.seed=5") == key("seed=5")
    assert key("seed=1") != key("seed=2")  # None: the run's seed, as before
    assert key("seed=1") == key("seed=1", "pretrain.seed=null")

    def weights(*overrides: str):
        out = tmp_path / "-".join(overrides)
        pretrain(smoke_config("pretrain.max_steps=2", "pretrain.eval_every=1000", *overrides), out, False)
        return load_file(out / "model.safetensors")

    shared, own = weights("seed=5"), weights("seed=9", "pretrain.seed=5")
    assert all(torch.equal(shared[name], own[name]) for name in shared)
    other = weights("seed=9")
    assert any(not torch.equal(shared[name], other[name]) for name in shared)
