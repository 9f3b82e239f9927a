"""The report: groups named by the keys that differ, table numbers equal to the metrics, valid figures, baseline."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import typer

from heterorl.config import config_to_yaml, load_config
from heterorl.report import ReportError, ReportResult, make_report, report_command
from heterorl.report.runs import flatten, group_runs, load_run
from heterorl.sinks import (
    MissingPackageError,
    SinkError,
    scalars,
    tensorboard_export,
    wandb_export,
    wandb_preflight,
)

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SYNC = ["cluster.mode=sync"]
ASYNC = ["cluster.mode=async", "cluster.max_staleness=4"]

# Known numbers per (group, seed): eval accuracies at steps 0, 2, 4 and per-step staleness / KL / reward.
FIXTURES: dict[tuple[str, int], dict[str, list[float]]] = {
    ("sync", 0): {"acc": [0.30, 0.40, 0.35], "stale": [0, 0, 0, 0], "kl": [1e-5, 2e-5, 1e-5, 2e-5]},
    ("sync", 1): {"acc": [0.30, 0.50, 0.45], "stale": [0, 0, 0, 0], "kl": [2e-5, 2e-5, 2e-5, 2e-5]},
    ("async", 0): {"acc": [0.30, 0.35, 0.30], "stale": [1, 2, 2, 3], "kl": [1e-3, 2e-3, 4e-3, 8e-3]},
    ("async", 1): {"acc": [0.30, 0.45, 0.40], "stale": [0, 1, 2, 1], "kl": [5e-4, 1e-3, 2e-3, 1e-3]},
}
REWARDS = [0.1, 0.2, 0.3, 0.4]


def write_run(
    run_dir: Path, overrides: list[str], seed: int, acc: list[float], stale: list[float], kl: list[float]
) -> Path:
    """A small run directory with the layout of `heterorl run` (4 learner steps, evaluations at 0, 2, 4)."""
    cfg = load_config(REPO / "configs" / "smoke.yaml", [*overrides, f"seed={seed}", "learner.steps=4"])
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(config_to_yaml(cfg))
    records: list[dict[str, Any]] = [{"kind": "eval", "step": 0, "time/virtual": 0.0, "eval/accuracy": acc[0]}]
    for step in range(1, 5):
        records.append(
            {
                "kind": "train",
                "step": step,
                "version": step,
                "time/virtual": 1.5 * step,
                "reward/mean": REWARDS[step - 1] + 0.01 * seed,
                "stale/mean": float(stale[step - 1]),
                "obj/kl_k3": kl[step - 1],
                "obj/is_weight_var": 10 * kl[step - 1],
                "sync/bytes": 1000.0 * step,
                "sync/full_bytes": 4000.0,
            }
        )
        if step % 2 == 0:
            records.append({"kind": "eval", "step": step, "time/virtual": 1.5 * step, "eval/accuracy": acc[step // 2]})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    histogram: dict[str, int] = {}
    for s in stale:
        histogram[str(int(s))] = histogram.get(str(int(s)), 0) + 16
    summary = {"wall_seconds": 10.0 + seed, "staleness_histogram": histogram, "groups_dropped": 0}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def write_runs(root: Path) -> list[Path]:
    """2 groups (sync; async with a staleness window of 4) x 2 seeds."""
    modes = {"sync": SYNC, "async": ASYNC}
    return [
        write_run(root / f"{mode}-{seed}", modes[mode], seed, **numbers) for (mode, seed), numbers in FIXTURES.items()
    ]


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    """Fresh run directories, for tests that change them."""
    return write_runs(tmp_path / "runs")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> ReportResult:
    """One report over the 2 x 2 runs against the sync baseline, shared by the tests that only read it."""
    root = tmp_path_factory.mktemp("report")
    return make_report(write_runs(root / "runs"), root / "report", baseline="cluster.mode=sync")


def parse_table(markdown: str, section: str) -> dict[str, dict[str, str]]:
    """The markdown table under `## section` as {first cell: {column: cell}}."""
    lines = markdown.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0].splitlines()
    rows = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in lines if line.startswith("|")]
    header, body = rows[0], rows[2:]
    return {row[0]: dict(zip(header, row, strict=True)) for row in body}


def mean_std_pct(values: list[float]) -> str:
    return f"{statistics.fmean(values) * 100:.1f} ± {statistics.stdev(values) * 100:.1f}"


def test_groups_are_named_by_the_keys_that_differ(runs: list[Path]) -> None:
    grouping = group_runs([load_run(p) for p in runs])
    assert grouping.keys == ["cluster.mode", "cluster.max_staleness"]
    assert [g.name for g in grouping.groups] == ["mode=sync, max_staleness=null", "mode=async, max_staleness=4"]
    assert [[r.seed for r in g.runs] for g in grouping.groups] == [[0, 1], [0, 1]]
    assert grouping.unlisted == ""  # two groups: every value names one


def test_group_names_skip_fields_of_another_objective(tmp_path: Path) -> None:
    """grpo vs gepo differ in every objective field; only the name (and a field varied within grpo) shows."""
    numbers = FIXTURES[("sync", 0)]
    paths = [
        write_run(tmp_path / "a", ["objective.name=grpo"], 0, **numbers),
        write_run(tmp_path / "b", ["objective.name=grpo", "objective.eps_high=0.28"], 0, **numbers),
        write_run(tmp_path / "c", ["objective.name=gepo"], 0, **numbers),
    ]
    grouping = group_runs([load_run(p) for p in paths])
    assert grouping.keys == ["objective.name", "objective.eps_high"]  # not every field grpo and gepo set apart
    assert [g.name for g in grouping.groups] == [
        "objective=grpo(eps_high=0.2)",
        "objective=grpo(eps_high=0.28)",
        "objective=gepo",
    ]


def test_flatten_counts_list_items() -> None:
    flat = flatten({"cluster": {"samplers": [{"speed": 1}, {"speed": 2}]}, "seed": 0})
    assert flat == {
        "cluster.samplers.count": 2,
        "cluster.samplers.0.speed": 1,
        "cluster.samplers.1.speed": 2,
        "seed": 0,
    }


def test_table_numbers_equal_the_metrics(report: ReportResult) -> None:
    table = parse_table(report.report_md.read_text(), "Summary")
    sync, asyn = table["mode=sync, max_staleness=null"], table["mode=async, max_staleness=4"]
    best = {m: [max(FIXTURES[(m, s)]["acc"]) for s in (0, 1)] for m in ("sync", "async")}
    last = {m: [FIXTURES[(m, s)]["acc"][-1] for s in (0, 1)] for m in ("sync", "async")}
    assert sync["best acc %"] == mean_std_pct(best["sync"]) == "45.0 ± 7.1"
    assert asyn["best acc %"] == mean_std_pct(best["async"]) == "40.0 ± 7.1"
    assert asyn["last acc %"] == mean_std_pct(last["async"]) == "35.0 ± 7.1"
    assert sync["seeds"] == asyn["seeds"] == "0, 1"
    # staleness: mean over steps per run, then over seeds: (2.0 + 1.0) / 2
    assert asyn["staleness"] == "1.50"
    assert sync["staleness"] == "0.00"
    kl = statistics.fmean(statistics.fmean(FIXTURES[("async", s)]["kl"]) for s in (0, 1))
    assert asyn["KL (k3)"] == f"{kl:.2e}"
    # final reward: last k = 1 step of 4 (clamp(4 // 4, 1, 10)), mean over seeds of 0.4 and 0.41
    assert asyn["final reward"] == "0.405"
    assert asyn["virtual s"] == "6.0"
    assert asyn["wall s"] == "10.5"
    # baseline: the sync group; Δ = group mean - baseline mean, degradation = (base - group) / base
    assert asyn["Δ best (pts)"] == "-5.0"
    assert asyn["Δ last (pts)"] == "-5.0"
    assert asyn["degradation %"] == f"{(0.45 - 0.40) / 0.45 * 100:+.1f}" == "+11.1"
    assert sync["Δ best (pts)"] == "+0.0"
    assert sync["baseline"] == "(itself)"
    assert asyn["baseline"] == "mode=sync, max_staleness=null"


def test_report_json_holds_the_unrounded_numbers(report: ReportResult) -> None:
    data = json.loads(report.report_json.read_text())
    by_name = {g["name"]: g for g in data["groups"]}
    asyn = by_name["mode=async, max_staleness=4"]
    assert asyn["stats"]["best_accuracy"]["mean"] == pytest.approx(0.40)
    assert asyn["stats"]["staleness_mean"]["mean"] == pytest.approx(1.5)
    assert asyn["staleness_histogram"] == {"0": 16, "1": 48, "2": 48, "3": 16}  # summed over seeds
    assert asyn["label"] == {"cluster.mode": "async", "cluster.max_staleness": "4"}


def test_figures_are_valid_pngs_embedded_by_relative_path(report: ReportResult) -> None:
    assert set(report.plots) == {"accuracy", "reward", "offpolicy", "staleness", "traffic"}
    markdown = report.report_md.read_text()
    for path in report.plots.values():
        assert path.parent == report.report_md.parent
        data = path.read_bytes()
        assert data[:8] == PNG_MAGIC, path
        assert len(data) > 5_000, path
        assert f"]({path.name})" in markdown


def test_traffic_table_and_figure_only_when_logged(report: ReportResult, runs: list[Path], tmp_path: Path) -> None:
    table = parse_table(report.report_md.read_text(), "Weight traffic")
    # sent: 1000 + 2000 + 3000 + 4000 bytes; full: 4 x 4000
    assert table["mode=async, max_staleness=4"] == {
        "group": "mode=async, max_staleness=4",
        "sent MB": "0.01",
        "full MB": "0.02",
        "full / sent": "1.60",
    }
    for path in runs:
        lines = (path / "metrics.jsonl").read_text().splitlines()
        records = [{k: v for k, v in json.loads(line).items() if not k.startswith("sync/")} for line in lines]
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = make_report(runs, tmp_path / "without")
    assert "traffic" not in result.plots
    assert "## Weight traffic" not in result.report_md.read_text()


def test_baseline_is_the_nearest_matching_group(tmp_path: Path) -> None:
    """Objectives x modes: each async objective is compared with the sync run of the same objective."""
    paths = []
    for objective, sync_best, async_best in (("grpo", 0.6, 0.3), ("gepo", 0.5, 0.45)):
        for mode, best in (("sync", sync_best), ("async", async_best)):
            overrides = [f"objective.name={objective}", *(SYNC if mode == "sync" else ASYNC)]
            numbers = {**FIXTURES[(mode, 0)], "acc": [0.2, best, best]}
            paths.append(write_run(tmp_path / f"{objective}-{mode}", overrides, 0, **numbers))
    result = make_report(paths, tmp_path / "report", baseline="cluster.mode=sync")
    stats = {g.name: g for g in result.groups}
    grpo_async = stats["objective=grpo, mode=async, max_staleness=4"]
    gepo_async = stats["objective=gepo, mode=async, max_staleness=4"]
    assert grpo_async.baseline == "objective=grpo, mode=sync, max_staleness=null"
    assert grpo_async.best_delta == pytest.approx(-0.3)
    assert gepo_async.baseline == "objective=gepo, mode=sync, max_staleness=null"
    assert gepo_async.best_degradation == pytest.approx(0.1)
    assert [g.baseline == g.name for g in result.groups] == [True, True, False, False]  # baselines first


def test_group_by_overrides_the_automatic_grouping(runs: list[Path]) -> None:
    grouping = group_runs([load_run(p) for p in runs], group_by=["cluster.mode"])
    assert grouping.keys == ["cluster.mode"]
    assert [(g.name, len(g.runs)) for g in grouping.groups] == [("mode=sync", 2), ("mode=async", 2)]
    with pytest.raises(ReportError, match=r"cluster\.moed"):
        group_runs([load_run(p) for p in runs], group_by=["cluster.moed"])


def test_a_sweep_directory_expands_and_unfinished_runs_are_left_out(runs: list[Path], tmp_path: Path) -> None:
    (runs[0] / "summary.json").unlink()
    result = make_report([runs[0].parent], tmp_path / "report")
    assert result.unfinished == [runs[0]]
    assert sum(len(g.seeds) for g in result.groups) == 3
    assert "Unfinished" in result.report_md.read_text()


def test_bad_inputs_fail_with_the_reason(runs: list[Path], tmp_path: Path) -> None:
    with pytest.raises(ReportError, match=r"no config\.yaml"):
        make_report([tmp_path / "nothing-here"], tmp_path / "report")
    with pytest.raises(ReportError, match=r"no group has cluster.mode=lockstep .*'async', 'sync'"):
        make_report(runs, tmp_path / "report", baseline="cluster.mode=lockstep")


def test_report_command_prints_the_table_and_the_path(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report_command(runs, tmp_path / "report", "cluster.mode=sync")
    out = capsys.readouterr().out  # results go to stdout, so `heterorl report ... > file` keeps them
    assert "45.0 ± 7.1" in out  # best accuracy of the sync group
    assert "-5.0" in out  # the async group's Δ best
    assert f"report: {tmp_path / 'report' / 'report.md'}" in out
    with pytest.raises(typer.Exit) as exit_info:
        report_command(runs, tmp_path / "report", "cluster.mode=lockstep")
    assert exit_info.value.exit_code == 2


def test_exports_name_the_missing_package(runs: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(MissingPackageError, match="pip install tensorboard"):
        tensorboard_export(runs[0])
    with pytest.raises(MissingPackageError, match="pip install wandb"):
        wandb_export(runs[0])


def test_scalars_keep_finite_numbers_only() -> None:
    record = {"kind": "train", "step": 3, "a": 1, "b": 0.5, "c": None, "d": True, "e": float("inf"), "f": "x"}
    assert scalars(record) == {"a": 1.0, "b": 0.5}


def test_tensorboard_export_writes_every_scalar(runs: list[Path]) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_dir = tensorboard_export(runs[2])
    events = EventAccumulator(str(log_dir))
    events.Reload()
    assert [e.value for e in events.Scalars("stale/mean")] == pytest.approx([1.0, 2.0, 2.0, 3.0])
    assert [e.step for e in events.Scalars("eval/accuracy")] == [0, 2, 4]


def test_wandb_export_writes_an_offline_run(runs: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_path = wandb_export(runs[0])
    assert run_path.is_dir()
    assert any(run_path.glob("*.wandb"))


@pytest.fixture
def no_wandb_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


def test_wandb_online_without_a_key_is_one_clear_line(runs: list[Path], no_wandb_credentials: None) -> None:
    pytest.importorskip("wandb")
    with pytest.raises(SinkError) as info:
        wandb_export(runs[0], mode="online")
    message = str(info.value)
    assert message.startswith("metrics.wandb_mode online needs a W&B API key for https://api.wandb.ai")
    assert "\n" not in message
    assert not (runs[0] / "wandb").exists()  # nothing was started


def test_wandb_online_without_a_network_is_one_clear_line(
    runs: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    (tmp_path / "netrc").write_text("machine 127.0.0.1 login user password " + "k" * 40 + "\n")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))  # the key comes from netrc, as `wandb login` writes it
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # loopback, nothing listens: no traffic leaves
    with pytest.raises(SinkError, match=r"^metrics\.wandb_mode online, but http://127\.0\.0\.1:9 cannot be reached"):
        wandb_export(runs[0], mode="online")


def test_wandb_offline_needs_neither(runs: list[Path], no_wandb_credentials: None, monkeypatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert wandb_preflight("offline") is None
    assert any(wandb_export(runs[0], mode="offline").glob("*.wandb"))
