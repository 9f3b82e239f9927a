"""The report's figures (PNG). Object-oriented matplotlib (`Figure`, no pyplot): rendering uses the Agg canvas
and never touches the global backend of the process that asked for a report.

Each group keeps one colour (and, beyond the colour map's 20 colours, one line style and marker) in every figure.
Curves over seeds are aligned on the steps every run of the group logged (a run that stopped early shortens its
group's curve rather than biasing the mean).

Legends sit below the panels, never wider than the figure: labels wrap at their commas, as many columns as the
longest line allows, and the figure grows taller by the legend's height, so no label is clipped.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, MaxNLocator

from heterorl.report.runs import Group, RunData
from heterorl.report.side_by_side import ClockFigures

DPI = 120
LOG_SPAN = 100.0  # use a log y axis when the positive values span more than this factor
PANEL_WIDTH_IN, PANEL_HEIGHT_IN = 6.0, 3.8
# Legend text ("small", ~8.3 pt DejaVu Sans): characters per inch of width (a little under the mean glyph width,
# so lines never reach the edge), the height of one text line and the gap between entries, in inches.
LEGEND_CHARS_PER_IN = 14.0
LEGEND_LINE_IN, LEGEND_GAP_IN = 0.145, 0.06
LEGEND_HANDLE_CHARS = 7  # the handle and the gap to the next column, in characters
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")


def styles(groups: list[Group]) -> dict[str, dict[str, Any]]:
    """Matplotlib style per group, stable across figures: a colour (tab10, tab20 beyond ten groups), and beyond
    twenty groups a line style and marker, so no two groups look alike."""
    cmap = mpl.colormaps["tab10" if len(groups) <= 10 else "tab20"]
    return {
        g.name: {
            "color": cmap(i % cmap.N),
            "ls": LINESTYLES[i // cmap.N % len(LINESTYLES)],
            "marker": MARKERS[i // cmap.N % len(MARKERS)],
        }
        for i, g in enumerate(groups)
    }


def _figure(ncols: int = 1) -> tuple[Figure, list[Axes]]:
    """A figure of `ncols` panels side by side; `_finish` adds the legend below them."""
    fig = Figure(figsize=(PANEL_WIDTH_IN * ncols, PANEL_HEIGHT_IN), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def legend_layout(labels: list[str], width_in: float, title: str = "") -> tuple[list[str], str, int, float]:
    """(wrapped labels, wrapped title, columns, height in inches) of a legend that fits `width_in`.

    Labels wrap at spaces (our labels put one after every comma) to the figure's width; then as many columns as
    the longest line allows. Matplotlib fills columns with consecutive runs of entries (`np.array_split`), so the
    height is that of the tallest column, plus the title's lines.
    """
    chars = max(20, int(width_in * LEGEND_CHARS_PER_IN) - LEGEND_HANDLE_CHARS)
    wrapped = [textwrap.fill(label, width=chars, break_on_hyphens=False) for label in labels]
    longest = max((len(line) for label in wrapped for line in label.splitlines()), default=1)
    ncol = max(1, min(len(labels), (chars + LEGEND_HANDLE_CHARS) // (longest + LEGEND_HANDLE_CHARS)))
    columns = np.array_split(np.array([label.count("\n") + 1 for label in wrapped]), ncol)
    tallest = max(int(col.sum()) * LEGEND_LINE_IN + len(col) * LEGEND_GAP_IN for col in columns)
    title_wrapped = textwrap.fill(title, width=chars + LEGEND_HANDLE_CHARS, break_on_hyphens=False) if title else ""
    title_in = (title_wrapped.count("\n") + 1) * LEGEND_LINE_IN + LEGEND_GAP_IN if title else 0.0
    return wrapped, title_wrapped, ncol, tallest + title_in


def _finish(fig: Figure, path: Path, title: str = "", legend_title: str | None = None) -> Path:
    """Integer x ticks (where the panel did not name its ticks), the legend below the panels (wrapped to the
    figure's width; `title`: the values the group names leave out, or `legend_title` as given), the figure made
    taller by the legend's height; saved as PNG."""
    for ax in fig.axes:  # steps and staleness are whole numbers
        if not isinstance(ax.xaxis.get_major_locator(), FixedLocator):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, labels = fig.axes[0].get_legend_handles_labels()
    if handles:
        heading = legend_title if legend_title is not None else title and f"not listed: {title}"
        wrapped, title_text, ncol, height = legend_layout(labels, fig.get_figwidth(), heading)
        fig.set_figheight(PANEL_HEIGHT_IN + height + 0.2)
        fig.legend(
            handles,
            wrapped,
            loc="outside lower center",
            ncols=ncol,
            fontsize="small",
            title=title_text or None,
            title_fontsize="small",
            frameon=False,
        )
    fig.savefig(path, dpi=DPI)
    return path


def _maybe_log(ax: Axes, values: np.ndarray) -> None:
    positive = values[values > 0]
    if positive.size and positive.size == values.size and positive.max() / positive.min() > LOG_SPAN:
        ax.set_yscale("log")


def aligned(runs: list[RunData], records: Callable[[RunData], list[dict[str, Any]]], key: str):
    """(steps_S, values_RS): `key` of every run at the steps all runs logged it."""
    per_run = [{r["step"]: float(r[key]) for r in records(run) if r.get(key) is not None} for run in runs]
    steps = sorted(set.intersection(*(set(d) for d in per_run))) if per_run else []
    values_RS = np.array([[d[s] for s in steps] for d in per_run], dtype=float).reshape(len(runs), len(steps))
    return np.array(steps, dtype=float), values_RS


def curves(
    groups: list[Group], key: str, evals: bool, title: str, ylabel: str, path: Path, unlisted: str = ""
) -> Path | None:
    """Mean over seeds per group with the min–max band; None when no run logged `key`."""
    fig, (ax,) = _figure()
    style = styles(groups)
    drawn = False
    for group in groups:
        steps_S, values_RS = aligned(group.runs, (lambda r: r.evals) if evals else (lambda r: r.train), key)
        if not steps_S.size:
            continue
        drawn = True
        st = style[group.name]
        label = f"{group.name} (n={len(group.runs)})"
        marker = st["marker"] if evals else None
        ax.plot(steps_S, values_RS.mean(axis=0), color=st["color"], ls=st["ls"], label=label, marker=marker, ms=3)
        if len(group.runs) > 1:
            ax.fill_between(steps_S, values_RS.min(axis=0), values_RS.max(axis=0), color=st["color"], alpha=0.2, lw=0)
    if not drawn:
        return None
    ax.set(title=title, xlabel="learner step", ylabel=ylabel)
    ax.grid(alpha=0.3)
    return _finish(fig, path, unlisted)


def offpolicy_scatter(groups: list[Group], path: Path, unlisted: str = "") -> Path | None:
    """Per learner step: learner–sampler KL (k3) and importance-weight variance against the batch staleness."""
    panels = (("obj/kl_k3", "learner–sampler KL (k3)"), ("obj/is_weight_var", "importance-weight variance"))
    fig, axes = _figure(ncols=2)
    style = styles(groups)
    drawn = False
    for ax, (key, ylabel) in zip(axes, panels, strict=True):
        ys = []
        for group in groups:
            x = [r["stale/mean"] for run in group.runs for r in run.train if _has(r, "stale/mean", key)]
            y = [r[key] for run in group.runs for r in run.train if _has(r, "stale/mean", key)]
            if x:
                drawn = True
                st = style[group.name]
                ax.scatter(x, y, s=10, alpha=0.6, color=st["color"], marker=st["marker"], label=group.name)
                ys.extend(y)
        _maybe_log(ax, np.array(ys, dtype=float))
        ax.set(title=f"{ylabel} vs staleness", xlabel="batch mean staleness (learner steps)", ylabel=ylabel)
        ax.grid(alpha=0.3)
    return _finish(fig, path, unlisted) if drawn else None


def _has(record: dict[str, Any], *keys: str) -> bool:
    return all(record.get(k) is not None for k in keys)


def staleness_counts(group: Group) -> dict[int, int]:
    """summary.json `staleness_histogram` summed over the group's finished runs."""
    total: dict[int, int] = {}
    for run in group.runs:
        for staleness, count in ((run.summary or {}).get("staleness_histogram") or {}).items():
            total[int(staleness)] = total.get(int(staleness), 0) + int(count)
    return total


def staleness_histograms(groups: list[Group], path: Path, unlisted: str = "") -> Path | None:
    """Share of trained groups per staleness, bars side by side per report group (shares, so seeds and batch
    sizes compare); the legend gives the groups dropped by the staleness window."""
    counts = {g.name: staleness_counts(g) for g in groups}
    if not any(counts.values()):
        return None
    fig, (ax,) = _figure()
    style = styles(groups)
    width = 0.8 / len(groups)
    for i, group in enumerate(groups):
        hist = counts[group.name]
        if not hist:
            continue
        staleness = np.array(sorted(hist), dtype=float)
        share = np.array([hist[int(s)] for s in staleness], dtype=float) / sum(hist.values())
        dropped = sum(int((r.summary or {}).get("groups_dropped", 0)) for r in group.runs)
        offset = (i - (len(groups) - 1) / 2) * width
        label = f"{group.name} (dropped {dropped})"
        hatch = None if style[group.name]["ls"] == "-" else "//"  # beyond the colour map's colours
        ax.bar(staleness + offset, share, width=width, color=style[group.name]["color"], hatch=hatch, label=label)
    ax.set(title="Staleness of trained groups", xlabel="staleness (learner steps)", ylabel="share of groups")
    ax.grid(alpha=0.3, axis="y")
    return _finish(fig, path, unlisted)


def weight_traffic(groups: list[Group], path: Path, unlisted: str = "") -> Path | None:
    """Bytes sent per weight version against the full-snapshot equivalent, and their ratio (mean over seeds)."""
    fig, (ax_bytes, ax_ratio) = _figure(ncols=2)
    style = styles(groups)
    drawn = False
    for group in groups:
        steps_S, sent_RS = aligned(group.runs, lambda r: r.train, "sync/bytes")
        full_steps_S, full_RS = aligned(group.runs, lambda r: r.train, "sync/full_bytes")
        if not steps_S.size or not np.array_equal(steps_S, full_steps_S):
            continue
        drawn = True
        c, ls = style[group.name]["color"], style[group.name]["ls"]
        sent_S, full_S = sent_RS.mean(axis=0), full_RS.mean(axis=0)
        ax_bytes.plot(steps_S, sent_S / 1e6, color=c, ls=ls, label=group.name)
        ax_bytes.plot(steps_S, full_S / 1e6, color=c, ls="--", alpha=0.6)
        ax_ratio.plot(steps_S, full_S / np.maximum(sent_S, 1.0), color=c, ls=ls)
    if not drawn:
        return None
    ax_bytes.set(title="Weight bytes per version (dashed: full)", xlabel="learner step", ylabel="MB (all samplers)")
    ax_bytes.set_yscale("log")
    ax_ratio.set(title="Full / sent bytes", xlabel="learner step", ylabel="compression ratio (x)")
    for ax in (ax_bytes, ax_ratio):
        ax.grid(alpha=0.3)
    return _finish(fig, path, unlisted)


def sim_vs_live(figures: list[ClockFigures], path: Path) -> Path:
    """Three panels, one bar per run: the staleness histograms (share of trained groups), each sampler's share of
    the trained groups, each sampler's mean staleness. Simulated runs hatched, live ones solid."""
    fig, (ax_hist, ax_share, ax_stale) = _figure(ncols=3)
    style = styles([Group(f.name, {}) for f in figures])
    width = 0.8 / len(figures)
    samplers = sorted({n for f in figures for n in f.sampler_share})
    for i, f in enumerate(figures):
        offset = (i - (len(figures) - 1) / 2) * width
        kw = {"color": style[f.name]["color"], "hatch": "//" if f.simulated else None, "width": width}
        label = f"{f.name} ({'virtual' if f.simulated else 'wall'} clock)"
        if f.histogram:
            s = np.array(sorted(f.histogram), dtype=float)
            share = np.array([f.histogram[int(k)] for k in s], dtype=float) / sum(f.histogram.values())
            ax_hist.bar(s + offset, share, label=label, **kw)
        x = np.arange(len(samplers), dtype=float) + offset
        ax_share.bar(x, [f.sampler_share.get(n, math.nan) * 100 for n in samplers], **kw)
        ax_stale.bar(x, [f.sampler_staleness.get(n, math.nan) for n in samplers], **kw)
    ax_hist.set(title="Staleness of trained groups", xlabel="staleness (learner steps)", ylabel="share of groups")
    for ax, title, ylabel in (
        (ax_share, "Share of trained groups per sampler", "% of trained groups"),
        (ax_stale, "Mean staleness per sampler", "staleness (learner steps)"),
    ):
        ax.set_xticks(range(len(samplers)), samplers)
        ax.set(title=title, xlabel="sampler", ylabel=ylabel)
    for ax in (ax_hist, ax_share, ax_stale):
        ax.grid(alpha=0.3, axis="y")
    return _finish(fig, path, legend_title="hatched: simulated (virtual clock); solid: live (wall clock)")


def plot_all(groups: list[Group], out: Path, unlisted: str = "") -> dict[str, Path]:
    """Every figure that has data, keyed by a short name; paths are inside `out`. `unlisted`: the values the
    group names leave out (`Grouping.unlisted`), shown as the legends' title."""
    figures = {
        "accuracy": curves(
            groups,
            "eval/accuracy",
            True,
            "Held-out accuracy (mean, min–max over seeds)",
            "greedy accuracy",
            out / "accuracy.png",
            unlisted,
        ),
        "reward": curves(
            groups,
            "reward/mean",
            False,
            "Batch reward (mean, min–max over seeds)",
            "reward",
            out / "reward.png",
            unlisted,
        ),
        "offpolicy": offpolicy_scatter(groups, out / "kl_is_vs_staleness.png", unlisted),
        "staleness": staleness_histograms(groups, out / "staleness_hist.png", unlisted),
        "traffic": weight_traffic(groups, out / "weight_traffic.png", unlisted),
    }
    return {name: path for name, path in figures.items() if path is not None}
