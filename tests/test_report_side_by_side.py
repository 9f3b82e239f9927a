"""`heterorl report` with simulated and live runs: the side-by-side table's numbers and errors against
hand-computed values, its figure, report.json, and nothing of it when all runs share one clock."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from heterorl.report import make_report, report_command
from heterorl.report.side_by_side import percentile
from test_report import PNG_MAGIC, SYNC, parse_table, write_run

STALE = [0, 0, 0, 0]


def clock_run(root: Path, name: str, clock: str, throughput: float, hist: dict[str, int], idle: float, share_a: float):
    """A run directory whose summary gives the side-by-side figures (samplers a and b)."""
    run = write_run(root / name, SYNC, 0, acc=[0.3, 0.4, 0.4], stale=STALE, kl=[1e-5] * 4)
    summary = json.loads((run / "summary.json").read_text())
    summary.update(
        clock=clock,
        tokens_per_clock_second=throughput,
        staleness_histogram=hist,
        learner_idle=idle,
        per_sampler={
            "a": {"trained_share": share_a, "staleness_mean": 1.0},
            "b": {"trained_share": 1 - share_a, "staleness_mean": None},  # nothing of b trained: n/a
        },
    )
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_percentile_of_a_histogram() -> None:
    hist = {0: 5, 1: 3, 4: 2}  # cumulative shares 0.5, 0.8, 1.0
    assert percentile(hist, 0.5) == 0
    assert percentile(hist, 0.8) == 1
    assert percentile(hist, 0.9) == 4
    assert math.isnan(percentile({}, 0.9))


def test_a_simulated_run_beside_two_live_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = [
        clock_run(tmp_path, "live-1", "wall", 100.0, {"1": 8, "3": 2}, 0.50, 0.6),  # mean 1.4, p90 3
        clock_run(tmp_path, "sim", "virtual", 110.0, {"1": 5, "2": 5}, 0.40, 0.5),  # mean 1.5, p90 2
        clock_run(tmp_path, "live-2", "wall", 120.0, {"1": 10}, 0.70, 0.8),  # mean 1.0, p90 1
    ]
    result = make_report(runs, tmp_path / "report")
    assert [f.name for f in result.clocks] == ["simulated: sim", "live: live-1", "live: live-2"]  # simulated first
    table = parse_table(result.report_md.read_text(), "Simulated vs live")
    live_mean_col, error_col = "live mean ± std (n=2)", "simulated − live"
    throughput = table["throughput (tokens / clock s)"]
    assert (throughput["simulated: sim"], throughput["live: live-1"], throughput["live: live-2"]) == (
        "110",
        "100",
        "120",
    )
    assert throughput[live_mean_col] == f"110 ± {math.sqrt(200):.4g}"
    assert throughput[error_col] == "+0.0%"
    stale = table["staleness mean (steps)"]
    assert stale[live_mean_col] == "1.20 ± 0.28"  # (1.4 + 1.0) / 2; std sqrt(0.08)
    assert stale[error_col] == f"{(1.5 - 1.2) / 1.2 * 100:+.1f}%"
    assert table["staleness p90 (steps)"][error_col] == "+0.0"  # 2 vs the mean of 3 and 1
    assert table["learner idle (%)"][error_col] == "-20.0"  # 40 vs 60 points
    assert table["a: share of trained groups (%)"][error_col] == "-20.0"  # 50 vs 70
    assert table["b: staleness mean (steps)"]["simulated: sim"] == "n/a"
    assert result.plots["sim_vs_live"].read_bytes()[:8] == PNG_MAGIC
    data = json.loads(result.report_json.read_text())
    assert [r["run"] for r in data["simulated_vs_live"]] == ["simulated: sim", "live: live-1", "live: live-2"]
    assert data["simulated_vs_live"][0]["staleness_p90"] == 2.0
    report_command(runs, tmp_path / "report2", baseline=None)  # the command prints the same comparison
    out = capsys.readouterr().out
    assert "simulated vs live" in out
    assert "+25.0%" in out  # staleness mean: 1.5 vs 1.2


def test_runs_of_one_clock_get_no_comparison(tmp_path: Path) -> None:
    runs = [clock_run(tmp_path, f"sim-{i}", "virtual", 100.0, {"0": 1}, 0.5, 0.5) for i in range(2)]
    result = make_report(runs, tmp_path / "report")
    assert result.clocks == []
    assert "sim_vs_live" not in result.plots
    assert "Simulated vs live" not in result.report_md.read_text()
