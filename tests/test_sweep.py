"""Sweeps: expansion, stable names, early validation, resuming, failures, parallel workers, one real sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from heterorl.config import RunConfig, config_to_yaml
from heterorl.naming import short_keys
from heterorl.report import make_report
from heterorl.sweep import (
    SweepError,
    expand,
    load_sweep,
    resolve_configs,
    run_sweep,
    sweep_command,
)

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"
FAIL_SEED = 13  # the fake runner fails for this seed


def fake_runner(cfg: RunConfig, run_dir: Path) -> None:
    """Writes a run directory like `heterorl run` does, without training (numbers derived from the seed).

    Module-level so that spawned worker processes can unpickle it. `mkdir` without exist_ok: a partial
    directory the sweep failed to clear makes the run fail.
    """
    if cfg.seed == FAIL_SEED:
        raise RuntimeError(f"injected failure for seed {cfg.seed}")
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(config_to_yaml(cfg))
    accuracy = 0.3 + 0.01 * cfg.seed
    records = [
        {"kind": "eval", "step": 0, "time/virtual": 0.0, "eval/accuracy": 0.3},
        {"kind": "train", "step": 1, "time/virtual": 1.0, "reward/mean": 0.2, "stale/mean": 0.0, "obj/kl_k3": 1e-4},
        {"kind": "eval", "step": 1, "time/virtual": 1.0, "eval/accuracy": accuracy},
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {
        "accuracy_best": accuracy,
        "wall_seconds": 0.1,
        "staleness_histogram": {"0": 16},
        "omp_threads": os.environ.get("OMP_NUM_THREADS"),  # what the sweep set for this worker
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    with (run_dir.parent / "calls.log").open("a") as log:
        log.write(run_dir.name + "\n")


def write_sweep(tmp_path: Path, **fields: Any) -> Path:
    """A sweep file over the smoke config writing into tmp_path/out; `fields` add or replace keys."""
    data = {"base": str(SMOKE), "name": "test", "out": str(tmp_path / "out"), **fields}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "out" / "calls.log"
    return log.read_text().split() if log.is_file() else []


def test_expansion_is_grid_times_zip_times_seeds(tmp_path: Path) -> None:
    path = write_sweep(
        tmp_path,
        grid={"objective.name": ["grpo", "gepo"], "cluster.max_staleness": [2, 8]},
        zip={"cluster.eta": [1, 4], "cluster.learner_step_seconds": [0.5, 2.0]},
        seeds=[0, 1, 2],
        set=["cluster.mode=async"],
    )
    runs = expand(load_sweep(path))
    assert len(runs) == 2 * 2 * 2 * 3
    first = runs[0]
    assert first.point == {
        "objective.name": "grpo",
        "cluster.max_staleness": 2,
        "cluster.eta": 1,
        "cluster.learner_step_seconds": 0.5,
        "seed": 0,
    }
    assert first.overrides[0] == "cluster.mode=async"  # fixed overrides first, the point's after
    assert first.name == "objective.name-grpo__max_staleness-2__eta-1__learner_step_seconds-0.5__seed-0"
    assert first.group == "objective.name-grpo__max_staleness-2__eta-1__learner_step_seconds-0.5"
    assert first.run_dir == tmp_path / "out" / first.name
    # zip rows vary together: eta=4 only with learner_step_seconds=2.0
    assert {(r.point["cluster.eta"], r.point["cluster.learner_step_seconds"]) for r in runs} == {(1, 0.5), (4, 2.0)}
    assert len({r.name for r in runs}) == len(runs)
    assert len({r.group for r in runs}) == len(runs) // 3  # seeds share a group
    assert [r.name for r in expand(load_sweep(path))] == [r.name for r in runs]  # stable
    cfg = resolve_configs(load_sweep(path), runs)[-1]
    assert (cfg.objective.name, cfg.cluster.max_staleness, cfg.cluster.eta, cfg.seed) == ("gepo", 8, 4, 2)


def test_names_are_filesystem_safe_and_distinct_for_structured_values(tmp_path: Path) -> None:
    delays = [{"kind": "weibull", "upper": 900}, {"kind": "weibull", "upper": 1800}]
    path = write_sweep(tmp_path, grid={"cluster.samplers": [[{"link": {"weights_delay": d}}] for d in delays]})
    names = [r.name for r in expand(load_sweep(path))]
    assert len(set(names)) == 2
    assert all(set(n) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-~") for n in names)


def test_short_keys_keep_generic_parts_with_their_parent() -> None:
    keys = ["objective.name", "task.name", "cluster.samplers.0.link.weights_delay.kind", "cluster.eta", "seed"]
    assert short_keys(keys) == {
        "objective.name": "objective.name",
        "task.name": "task.name",
        "cluster.samplers.0.link.weights_delay.kind": "weights_delay.kind",
        "cluster.eta": "eta",
        "seed": "seed",
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"zip": {"cluster.eta": [1, 2], "cluster.max_staleness": [1]}}, "equal lengths"),
        ({"grids": {}}, "grids"),
        ({"grid": {"cluster.eta": [1]}, "set": ["cluster.eta=2"]}, "also fixed in `set`"),
        ({"grid": {"seed": [1, 2]}}, "seeds"),
        ({"grid": {"cluster.eta": [1, 1]}}, "distinct"),
        ({"grid": {"cluster.eta": []}}, "grid.cluster.eta"),
        ({"set": ["no-equals-sign"]}, "dotted.key=value"),
        ({"workers": 0}, "workers"),
    ],
)
def test_invalid_sweep_files_name_the_field(tmp_path: Path, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SweepError, match=message):
        load_sweep(write_sweep(tmp_path, **fields))


def test_an_invalid_point_fails_before_anything_runs(tmp_path: Path) -> None:
    """max_staleness needs async mode: the sync points are invalid, and no run starts."""
    path = write_sweep(tmp_path, grid={"cluster.mode": ["async", "sync"]}, set=["cluster.max_staleness=4"])
    with pytest.raises(SweepError, match=r"1 of 2 .*\nmode-sync__seed-0: invalid config") as info:
        run_sweep(path, show_progress=False, runner=fake_runner)
    assert "mode-async" not in str(info.value)
    assert calls(tmp_path) == []


def test_finished_runs_are_skipped(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, seeds=[0, 1])
    sweep = load_sweep(path)
    runs = expand(sweep)
    fake_runner(resolve_configs(sweep, runs)[0], runs[0].run_dir)  # seed 0 finished earlier
    result = run_sweep(path, show_progress=False, runner=fake_runner)
    assert [(o.spec.name, o.status) for o in result.outcomes] == [("seed-0", "skipped"), ("seed-1", "done")]
    assert calls(tmp_path) == ["seed-0", "seed-1"]  # seed-0 once (written above), seed-1 once
    record = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert [(r["name"], r["status"]) for r in record["runs"]] == [("seed-0", "skipped"), ("seed-1", "done")]
    assert record["runs"][1]["overrides"] == ["seed=1"]
    rerun = run_sweep(path, show_progress=False, runner=fake_runner)
    assert {o.status for o in rerun.outcomes} == {"skipped"}
    assert calls(tmp_path) == ["seed-0", "seed-1"]


def test_a_finished_run_with_another_config_is_an_error(tmp_path: Path) -> None:
    path = write_sweep(tmp_path)
    run_sweep(path, show_progress=False, runner=fake_runner)
    write_sweep(tmp_path, set=["learner.lr=0.01"])  # the same point names, a different config
    with pytest.raises(SweepError, match="different config"):
        run_sweep(path, show_progress=False, runner=fake_runner)


def test_a_partial_run_directory_is_cleared_and_rerun(tmp_path: Path) -> None:
    path = write_sweep(tmp_path)
    partial = tmp_path / "out" / "seed-0"
    partial.mkdir(parents=True)
    (partial / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')
    (partial / "stale-file").write_text("from the interrupted run")
    result = run_sweep(path, show_progress=False, runner=fake_runner)
    assert [o.status for o in result.outcomes] == ["done"]
    assert not (partial / "stale-file").exists()
    assert (partial / "summary.json").is_file()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_run_is_reported_and_the_others_finish(tmp_path: Path, workers: int) -> None:
    path = write_sweep(tmp_path, seeds=[0, FAIL_SEED, 2], workers=workers)
    result = run_sweep(path, show_progress=False, runner=fake_runner)
    status = {o.spec.name: o.status for o in result.outcomes}
    assert status == {"seed-0": "done", f"seed-{FAIL_SEED}": "failed", "seed-2": "done"}
    (failed,) = result.failed
    assert failed.error == f"RuntimeError: injected failure for seed {FAIL_SEED}"
    record = json.loads(result.sweep_json.read_text())
    failed_record = next(r for r in record["runs"] if r["status"] == "failed")
    assert "injected failure" in failed_record["traceback"]
    assert sorted(calls(tmp_path)) == ["seed-0", "seed-2"]
    if workers > 1:  # worker processes run one torch thread each
        summary = json.loads((tmp_path / "out" / "seed-0" / "summary.json").read_text())
        assert summary["omp_threads"] == "1"


def test_sweep_command_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write_sweep(tmp_path, grid={"cluster.mode": ["sync"]}, set=["cluster.max_staleness=4"])
    assert sweep_command(bad, workers=None, quiet=True) == 2
    assert "mode-sync__seed-0: invalid config" in capsys.readouterr().err
    assert sweep_command(write_sweep(tmp_path, seeds=[FAIL_SEED]), None, True, runner=fake_runner) == 1
    assert "seed-13" in capsys.readouterr().err
    assert sweep_command(write_sweep(tmp_path, seeds=[0]), None, True, runner=fake_runner) == 0


def test_the_sweep_module_does_not_import_torch() -> None:
    code = "import sys, heterorl.sweep, heterorl.report; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


TINY_RUN = {  # a real run in seconds: the random tiny checkpoint (no pretraining), 1-digit addition
    "task": {"name": "addition", "digits": 1, "eval_size": 16},
    "sampler": {"group_size": 4, "max_new_tokens": 3},
    "learner": {"steps": 2, "groups_per_step": 4},
    "eval": {"every": 1},
    "weights": {"codec": "full"},
}


def test_a_real_sweep_and_its_report(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Two seeds trained for real by the default runner, then the report over the sweep's output directory."""
    base = tmp_path / "tiny.yaml"
    base.write_text(yaml.safe_dump({**TINY_RUN, "model": {"path": str(tiny_model_dir)}}))
    path = write_sweep(tmp_path, base=base.name, seeds=[0, 1])  # base relative to the sweep file
    result = run_sweep(path, show_progress=False)
    assert [o.status for o in result.outcomes] == ["done", "done"], [o.error for o in result.outcomes]
    summaries = [json.loads((o.spec.run_dir / "summary.json").read_text()) for o in result.outcomes]
    assert [s["steps"] for s in summaries] == [2, 2]
    report = make_report([result.sweep.out], tmp_path / "report")
    (group,) = report.groups
    assert group.seeds == [0, 1]
    assert group.stats["best_accuracy"].mean == pytest.approx(sum(s["accuracy_best"] for s in summaries) / 2)
    assert group.stats["last_accuracy"].mean == pytest.approx(sum(s["accuracy_final"] for s in summaries) / 2)
    assert group.stats["final_reward"].mean == pytest.approx(sum(s["reward_last"] for s in summaries) / 2)


def test_parallel_callers_pretrain_a_base_model_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sweep workers share cached base models: a per-model file lock makes the second caller wait and reuse it."""
    import threading
    import time

    import heterorl.pretrain
    from heterorl.config import load_config
    from heterorl.pretrain import PretrainResult, ensure_base_model

    calls: list[Path] = []

    def slow_pretrain(cfg, out, show_progress=True):
        calls.append(out)
        time.sleep(0.3)
        out.mkdir(parents=True)
        (out / "pretrain.json").write_text(json.dumps({"path": str(out), "steps": 1, "val_accuracy": 0.5}))
        return PretrainResult(str(out), 1, 0.5)

    monkeypatch.setattr(heterorl.pretrain, "pretrain", slow_pretrain)
    monkeypatch.setenv("HETERORL_CACHE", str(tmp_path / "cache"))  # nothing cached yet
    cfg = load_config(SMOKE)
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(ensure_base_model(cfg, False))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert sorted(r.cached for r in results) == [False, True]


@pytest.mark.parametrize("path", sorted((REPO / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_sweep_expands_into_valid_configs(path: Path) -> None:
    sweep = load_sweep(path)
    runs = expand(sweep)
    configs = resolve_configs(sweep, runs)  # raises, naming the point, if any config is invalid
    assert len(configs) == len(runs) == len({r.name for r in runs})
    assert {c.seed for c in configs} == set(sweep.spec.seeds)
