"""Report group names: compared on the keys that really differ, short enough for a legend, never clipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg

from heterorl.config import config_to_yaml, load_config
from heterorl.report import make_report, report_command
from heterorl.report.labels import comparison_keys, differing_keys, discriminator_patterns, group_labels
from heterorl.report.plots import PANEL_HEIGHT_IN, _figure, _finish, legend_layout
from heterorl.report.runs import flatten
from heterorl.sweep import expand, load_sweep, resolve_configs

REPO = Path(__file__).resolve().parents[1]


def flat(path: Path, *overrides: str) -> dict:
    cfg = load_config(path, list(overrides))
    return {k: v for k, v in flatten(yaml.safe_load(config_to_yaml(cfg))).items() if k != "seed"}


def sweep_configs(name: str) -> list[dict]:
    """The distinct configs (seed excluded) of a shipped sweep, as the report reads them from run directories."""
    sweep = load_sweep(REPO / "sweeps" / name)
    configs = resolve_configs(sweep, expand(sweep))
    flats = [{k: v for k, v in flatten(yaml.safe_load(config_to_yaml(c))).items() if k != "seed"} for c in configs]
    return list({json.dumps(f, sort_keys=True): f for f in flats}.values())


def test_discriminators_come_from_the_config_schema() -> None:
    patterns = discriminator_patterns()
    assert {"objective.name", "task.name", "sampler.engine.name"} <= patterns
    assert "cluster.samplers.*.link.weights_delay.kind" in patterns
    assert "cluster.samplers.*.name" not in patterns  # a sampler's name labels it; it chooses nothing


def test_objective_fields_belong_to_the_objective_name() -> None:
    """gepo-delay: over 30 keys differ in the raw configs (each objective has its own fields); 5 are compared."""
    configs = sweep_configs("gepo-delay.yaml")
    assert len(differing_keys(configs)) > 30
    naming = group_labels(configs)
    assert naming.keys == [
        "objective.name",
        "cluster.mode",
        "cluster.samplers.*.link.weights_delay.kind",
        "cluster.max_staleness",
        "cluster.samplers.*.link.weights_delay.upper",
    ]
    assert naming.names[0] == "objective=gepo, weights_delay=fixed, mode=sync, max_staleness=null"
    assert naming.names[1] == "objective=gepo, weights_delay=lognormal(upper=480), max_staleness=8"
    assert naming.unlisted == "mode=async"  # 20 of 25 groups: left out of their names, said once
    assert max(len(n) for n in naming.names) < 100


def test_samplers_with_equal_settings_are_named_once() -> None:
    """dg-frictions: the three samplers' delays change together; frictions off is the common case."""
    naming = group_labels(sweep_configs("dg-frictions.yaml"))
    assert "cluster.samplers.*.link.weights_delay.seconds" in naming.keys
    assert naming.unlisted == "actor_bug=0, rare_discovery=0, reward_corruption=0, weights_delay.seconds=0"
    assert naming.names[:3] == [
        "objective=dg",
        "objective=dg, weights_delay.seconds=400",
        "objective=dg, actor_bug=0.2",
    ]
    assert len(set(naming.names)) == len(naming.names) == 24


def test_extra_list_items_are_told_by_the_count() -> None:
    demo = REPO / "configs" / "demo.yaml"
    one = flat(demo, "cluster.samplers=[{name: fast, tokens_per_second: 4.0}]")
    three = flat(demo)
    keys = comparison_keys([one, three])
    assert "cluster.samplers.count" in keys
    assert not [k for k in keys if k.startswith(("cluster.samplers.1.", "cluster.samplers.2."))]


def test_a_field_of_one_list_item_keeps_its_index() -> None:
    demo = REPO / "configs" / "demo.yaml"
    configs = [flat(demo, f"cluster.samplers.0.tokens_per_second={s}") for s in (1, 2, 4)]
    assert group_labels(configs).names == [f"samplers.0.tokens_per_second={s}" for s in (1, 2, 4)]


@pytest.mark.parametrize("width_in", [6.0, 12.0])
def test_legend_lines_fit_the_figure(width_in: float) -> None:
    labels = [f"objective=decoupled_ppo, weights_delay=lognormal(upper={u}), max_staleness={u}" for u in range(25)]
    labels.append("a, " * 80)  # a label far wider than any figure
    wrapped, _, ncol, height = legend_layout(labels, width_in)
    chars = int(width_in * 14.0)  # characters of legend text per figure width
    longest = max(len(line) for label in wrapped for line in label.splitlines())
    assert longest <= chars - 7  # each line, with its handle, fits
    assert ncol * (longest + 7) <= chars  # and so do the columns side by side
    assert height > 26 * 0.145  # at least one text line per entry
    short = [f"lr={10.0**-k:g}, codec=pulse" for k in range(8)]  # 20 characters or so
    _, _, ncol, height = legend_layout(short, width_in)
    assert ncol == int(width_in * 14.0) // (max(map(len, short)) + 7)
    assert height == pytest.approx(-(-8 // ncol) * (0.145 + 0.06))  # the tallest column: ceil(8 / ncol) rows


def test_legend_is_inside_the_saved_figure(tmp_path: Path) -> None:
    fig, (ax,) = _figure()
    for i in range(24):
        name = f"objective=is_pg, actor_bug=0.2, rare_discovery=0.05, reward_corruption=0.2, seconds={i} (n=3)"
        ax.plot([0, 1], [i, i + 1], label=name)
    _finish(fig, tmp_path / "f.png", title="actor_bug=0, rare_discovery=0")
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    box, page = fig.legends[0].get_window_extent(renderer), fig.bbox
    assert page.x0 <= box.x0
    assert box.x1 <= page.x1
    assert page.y0 <= box.y0
    assert box.y1 <= page.y1
    assert fig.get_figheight() > PANEL_HEIGHT_IN + 24 * 0.145
    assert fig.legends[0].get_title().get_text().startswith("not listed: actor_bug=0")


def write_finished_run(path: Path, lr: float) -> None:
    cfg = load_config(REPO / "configs" / "smoke.yaml", [f"learner.lr={lr}", "learner.steps=2"])
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(config_to_yaml(cfg))
    records = [
        {"kind": "eval", "step": 0, "eval/accuracy": 0.25},
        {"kind": "train", "step": 1, "reward/mean": 0.5, "stale/mean": 0.0},
        {"kind": "train", "step": 2, "reward/mean": 0.6, "stale/mean": 0.0},
        {"kind": "eval", "step": 2, "eval/accuracy": 0.5},
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (path / "summary.json").write_text(json.dumps({"wall_seconds": 1.0, "staleness_histogram": {"0": 8}}))


def test_a_failed_runs_leftover_directory_is_skipped_with_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    write_finished_run(runs / "a", 1e-4)
    write_finished_run(runs / "b", 3e-4)
    failed = runs / "c-failed"  # `heterorl run` wrote its config, then the model path was missing
    failed.mkdir()
    (failed / "config.yaml").write_text(config_to_yaml(load_config(REPO / "configs" / "smoke.yaml")))
    result = make_report([runs], tmp_path / "report")
    assert [s.path for s in result.skipped] == [failed]
    assert "no metrics.jsonl" in result.skipped[0].reason
    assert sum(len(g.seeds) for g in result.groups) == 2
    report_command([runs], tmp_path / "report2", None)
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if "c-failed" in line]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"skipped {failed}")
    assert "lr=0.0001" in captured.out


def test_a_cut_short_metrics_file_is_skipped(tmp_path: Path) -> None:
    write_finished_run(tmp_path / "runs" / "a", 1e-4)
    write_finished_run(tmp_path / "runs" / "b", 3e-4)
    (tmp_path / "runs" / "b" / "metrics.jsonl").write_text('{"kind": "train", "st')
    result = make_report([tmp_path / "runs"], tmp_path / "report")
    assert [s.path.name for s in result.skipped] == ["b"]
    assert "cut short or corrupt" in result.skipped[0].reason


def test_terminal_table_folds_long_names_instead_of_cutting_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    runs = tmp_path / "runs"
    write_finished_run(runs / "a", 1e-4)
    write_finished_run(runs / "b", 3e-4)
    report_command([runs], tmp_path / "report", None)
    out = capsys.readouterr().out
    assert "…" not in out
    assert "lr=0.0003" in out.replace("\n", "").replace("│", "").replace(" ", "")
