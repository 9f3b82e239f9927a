"""`make_report`: run directories -> figures, report.md (tables that embed the figures) and report.json.

report.json holds the table's numbers unrounded, for scripts; report.md rounds them as stated in its notes.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from heterorl.report import side_by_side
from heterorl.report.labels import format_value
from heterorl.report.plots import plot_all, sim_vs_live, staleness_counts
from heterorl.report.runs import (
    Group,
    Grouping,
    ReportError,
    RunData,
    baseline_for,
    find_run_dirs,
    group_runs,
    load_run,
)
from heterorl.report.stats import GroupStats, Stat, group_stats, run_stats, with_baseline

NOTES = """\
- Accuracy is held-out greedy accuracy (`eval/accuracy`), in percent. *best*: the maximum over a run's evaluations,
  the initial one included; *last*: the latest evaluation. Cells are mean ± sample std over the group's seeds.
- *Δ best*, *Δ last*: group mean − baseline mean, in accuracy points (negative is worse). *degradation*:
  (baseline best − group best) / baseline best (positive is worse). The baseline of a group is the group matching
  `{baseline}` whose config agrees with it on the most keys.
- *staleness*, *KL*: means over learner steps of `stale/mean` and `obj/kl_k3`. *final reward*: mean `reward/mean`
  over the last k = clamp(steps // 4, 1, 10) steps (summary.json's `reward_last`). *virtual s*: `time/virtual` of
  the last learner step. *wall s*: summary.json `wall_seconds`.
"""


@dataclass(frozen=True)
class Skipped:
    """A run directory left out of the report because it cannot be read (a run that failed before training)."""

    path: Path
    reason: str


@dataclass
class ReportResult:
    """Where the report went and its numbers (the groups in table order); the run directories left out."""

    report_md: Path
    report_json: Path
    plots: dict[str, Path]
    groups: list[GroupStats]
    unfinished: list[Path] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    clocks: list[side_by_side.ClockFigures] = field(default_factory=list)  # simulated and live runs compared
    modelled: list[tuple[Path, str]] = field(default_factory=list)  # runs of a large-cluster plan, with their label


def modelled_runs(runs: list[RunData]) -> list[tuple[Path, str]]:
    """The runs whose message sizes and compute costs were a larger model's (`cluster.modelled`), each with the
    line its summary.json labels it with."""
    found = []
    for run in runs:
        section = (run.summary or {}).get("modelled")
        if isinstance(section, dict):
            found.append((run.path, str(section.get("note") or "sizes and costs modelled for a larger model")))
    return found


def _pct(stat: Stat) -> str:
    if math.isnan(stat.mean):
        return "n/a"
    return f"{stat.mean * 100:.1f} ± {stat.std * 100:.1f}" if stat.n > 1 else f"{stat.mean * 100:.1f}"


def _num(stat: Stat, spec: str) -> str:
    return "n/a" if math.isnan(stat.mean) else format(stat.mean, spec)


def _signed(value: float, spec: str) -> str:
    return "n/a" if math.isnan(value) else format(value, "+" + spec)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def summary_table(stats: list[GroupStats], with_baseline_columns: bool) -> list[str]:
    """The per-group markdown table (the numbers tests compare with the metrics)."""
    header = ["group", "seeds", "best acc %", "last acc %"]
    if with_baseline_columns:
        header += ["Δ best (pts)", "Δ last (pts)", "degradation %", "baseline"]
    header += ["staleness", "KL (k3)", "final reward", "virtual s", "wall s"]
    lines = [_row(header), _row(["---"] * len(header))]
    for g in stats:
        s = g.stats
        cells = [g.name, ", ".join(map(str, g.seeds)), _pct(s["best_accuracy"]), _pct(s["last_accuracy"])]
        if with_baseline_columns:
            cells += [
                _signed(g.best_delta * 100, ".1f"),
                _signed(g.last_delta * 100, ".1f"),
                _signed(g.best_degradation * 100, ".1f"),
                "(itself)" if g.baseline == g.name else str(g.baseline),
            ]
        cells += [
            _num(s["staleness_mean"], ".2f"),
            _num(s["kl_mean"], ".2e"),
            _num(s["final_reward"], ".3f"),
            _num(s["virtual_seconds"], ".1f"),
            _num(s["wall_seconds"], ".1f"),
        ]
        lines.append(_row(cells))
    return lines


def traffic_table(groups: list[Group]) -> list[str]:
    """Weight traffic per group (mean over seeds of each run's total): sent vs full-snapshot bytes."""
    rows = []
    for group in groups:
        sent = [sum(r.get("sync/bytes") or 0 for r in run.train) for run in group.runs]
        full = [sum(r.get("sync/full_bytes") or 0 for r in run.train) for run in group.runs]
        if any(full):
            mean_sent, mean_full = sum(sent) / len(sent), sum(full) / len(full)
            ratio = mean_full / mean_sent if mean_sent else math.nan
            rows.append(_row([group.name, f"{mean_sent / 1e6:.2f}", f"{mean_full / 1e6:.2f}", f"{ratio:.2f}"]))
    if not rows:
        return []
    return [_row(["group", "sent MB", "full MB", "full / sent"]), _row(["---"] * 4), *rows]


def runs_table(groups: list[Group], out: Path) -> list[str]:
    lines = [_row(["group", "seed", "best acc %", "last acc %", "staleness", "steps", "run"]), _row(["---"] * 7)]
    for group in groups:
        for run in group.runs:
            st = run_stats(run)
            rel = os.path.relpath(run.path, out)
            cells = [group.name, str(run.seed), f"{st.best_accuracy * 100:.1f}", f"{st.last_accuracy * 100:.1f}"]
            lines.append(_row([*cells, f"{st.staleness_mean:.2f}", str(st.steps), f"[{run.path.name}]({rel})"]))
    return lines


def render(
    grouping: Grouping,
    stats: list[GroupStats],
    plots: dict[str, Path],
    out: Path,
    baseline: str | None,
    unfinished: list[Path],
    skipped: list[Skipped],
    clocks: list[side_by_side.ClockFigures],
    modelled: list[tuple[Path, str]],
) -> str:
    """report.md: what was compared, the tables, the figures (relative paths) and the definitions."""
    groups, keys = grouping.groups, grouping.keys
    n_runs = sum(len(g.runs) for g in groups)
    lines = [
        "# heterorl report",
        "",
        f"{_count(n_runs, 'run')} in {_count(len(groups), 'group')}. Groups differ in: "
        + (", ".join(f"`{k}`" for k in keys) or "nothing (one group)")
        + ("; runs within a group differ only by `seed`." if keys else "."),
    ]
    if grouping.unlisted:
        lines.append(f"Group names leave out the values most groups share: `{grouping.unlisted}`.")
    if baseline:
        lines.append(f"Baseline: `{baseline}`.")
    lines += [f"`{os.path.relpath(path, out)}`: {note}." for path, note in modelled]
    lines += ["", "## Summary", "", *summary_table(stats, baseline is not None), ""]
    if traffic := traffic_table(groups):
        lines += ["## Weight traffic", "", *traffic, ""]
    if clocks:
        figure = os.path.relpath(plots["sim_vs_live"], out)
        lines += ["## Simulated vs live", "", *side_by_side.table(clocks), "", f"![Simulated vs live]({figure})", ""]
        lines += [side_by_side.NOTES]
    titles = {
        "accuracy": "Held-out accuracy",
        "reward": "Reward",
        "offpolicy": "Off-policy diagnostics vs staleness",
        "staleness": "Staleness histograms",
        "traffic": "Bytes per weight sync",
    }
    lines += ["## Figures", ""]
    for name, path in plots.items():
        if name == "sim_vs_live":
            continue  # in its own section
        lines += [f"### {titles[name]}", "", f"![{titles[name]}]({os.path.relpath(path, out)})", ""]
    lines += ["## Runs", "", *runs_table(groups, out), ""]
    if unfinished:
        lines += ["Unfinished (no summary.json; left out): " + ", ".join(f"`{p}`" for p in unfinished), ""]
    if skipped:
        lines += ["Unusable (left out): " + "; ".join(f"`{s.path}`: {s.reason}" for s in skipped), ""]
    lines += ["## Notes", "", NOTES.format(baseline=baseline or "--baseline KEY=VALUE")]
    return "\n".join(lines)


def _json_ready(
    stats: list[GroupStats], groups: list[Group], clocks: list[side_by_side.ClockFigures]
) -> dict[str, Any]:
    """report.json's content; NaN becomes null (JSON has no NaN)."""
    return _clean(
        {
            **({"simulated_vs_live": side_by_side.to_json(clocks)} if clocks else {}),
            "groups": [
                {
                    **asdict(s),
                    "label": {k: format_value(v) for k, v in g.label.items()},
                    "runs": [str(r.path) for r in g.runs],
                    "staleness_histogram": {str(k): v for k, v in sorted(staleness_counts(g).items())},
                }
                for s, g in zip(stats, groups, strict=True)
            ],
        }
    )


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def make_report(
    run_dirs: list[Path], out: Path, group_by: str | None = None, baseline: str | None = None
) -> ReportResult:
    """Group the runs (by differing config keys, seed excluded, or by the comma-separated `group_by` keys),
    compare them with the `baseline` group (`KEY=VALUE`) if given, and write figures, report.md and report.json
    into `out`. A path may also be a directory of run directories (a sweep's `out`)."""
    paths = find_run_dirs([Path(p) for p in run_dirs])
    loaded: list[RunData] = []
    skipped: list[Skipped] = []
    for path in paths:
        try:
            loaded.append(load_run(path))
        except ReportError as exc:  # the leftovers of a run that failed early: reported, not fatal
            skipped.append(Skipped(path, str(exc)))
    runs = [r for r in loaded if r.summary is not None]
    unfinished = [r.path for r in loaded if r.summary is None]
    if not runs:
        raise ReportError(
            f"no finished run (with summary.json) among {len(paths)} run directories"
            + (f"; unusable: {'; '.join(s.reason for s in skipped)}" if skipped else "")
        )
    keys_by = [k.strip() for k in group_by.split(",") if k.strip()] if group_by else None
    grouping = group_runs(runs, keys_by)
    groups = grouping.groups
    stats = [group_stats(g) for g in groups]
    if baseline:
        refs = baseline_for(groups, baseline)
        by_name = {s.name: s for s in stats}
        stats = [with_baseline(s, by_name[refs[s.name].name]) for s in stats]
        order = sorted(range(len(groups)), key=lambda i: stats[i].baseline != stats[i].name)  # baselines first
        groups, stats = [groups[i] for i in order], [stats[i] for i in order]
    out.mkdir(parents=True, exist_ok=True)
    plots = plot_all(groups, out, grouping.unlisted)
    clocks: list[side_by_side.ClockFigures] = []
    if side_by_side.both_clocks(runs):  # simulated runs first, then live ones, each in the order given
        clocks = sorted((side_by_side.clock_figures(r) for r in runs), key=lambda f: not f.simulated)
        plots["sim_vs_live"] = sim_vs_live(clocks, out / "sim_vs_live.png")
    report_md = out / "report.md"
    modelled = modelled_runs(runs)
    report_md.write_text(render(grouping, stats, plots, out, baseline, unfinished, skipped, clocks, modelled))
    report_json = out / "report.json"
    report_json.write_text(json.dumps(_json_ready(stats, groups, clocks), indent=2, default=str))
    return ReportResult(report_md, report_json, plots, stats, unfinished, skipped, clocks, modelled)
