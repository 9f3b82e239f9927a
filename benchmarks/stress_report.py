"""Tables and plots of an objectives x learning rate x staleness sweep (docs/results.md, issue 16).

    .venv/bin/python benchmarks/stress_report.py runs/stress-grid --out docs/results/stress-grid

Per cell (objective variant, learning rate, maximum staleness), over its seeds: best and last held-out accuracy
(mean ± std), collapse rate (share of runs whose last accuracy is below their own warm start's, i.e. below the
step-0 evaluation), mean observed staleness, and the means over learner steps of the learner–sampler KL
(`obj/kl_k3`), the objective's own importance-weight variance (`obj/is_weight_var`) and ESS (`obj/ess`). Writes
`cells.md` / `cells.json` (every cell), `accuracy_vs_staleness.png` (one panel per learning rate) and
`chain.png` (staleness -> KL -> weight variance, one point per run, with Pearson / Spearman correlations of the
logs) and prints the markdown to stdout.

The objective variant is `objective.name`, with `+clamp` / `+mask` when a behaviour-weight cap is set (decoupled
PPO always has one and is not marked) and `(eps=...)` when the clip range differs from the objective's default.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from heterorl.config.objectives import OBJECTIVE_CONFIGS
from heterorl.metrics import read_metrics

STEP_STATS = {"kl": "obj/kl_k3", "is_var": "obj/is_weight_var", "ess": "obj/ess", "clip_frac": "obj/clip_frac"}


def variant(objective: dict[str, Any]) -> str:
    """A short name for the objective and the options that set it apart from that objective's defaults."""
    name = objective["name"]
    defaults = OBJECTIVE_CONFIGS[name]().model_dump()
    label = name
    if name != "decoupled_ppo" and objective.get("cap_mode", "none") != "none":
        level = objective.get("cap_level", "token")
        label += f"+{objective['cap_mode']}" + ("" if level == "token" else f"({level})")
    changed = [k for k in ("eps", "eps_low", "eps_high", "dual_clip") if k in objective and objective[k] != defaults[k]]
    if changed:
        label += "(" + ",".join(f"{k}={objective[k]:g}" for k in changed) + ")"
    return label


def staleness_label(cluster: dict[str, Any]) -> int:
    return 0 if cluster["mode"] == "sync" else int(cluster["max_staleness"])


def load_runs(root: Path) -> list[dict[str, Any]]:
    runs = []
    for summary_path in sorted(root.glob("*/summary.json")):
        run = summary_path.parent
        config = yaml.safe_load((run / "config.yaml").read_text())
        summary = json.loads(summary_path.read_text())
        train = [r for r in read_metrics(run / "metrics.jsonl") if r.get("kind") == "train"]
        row = {
            "run": run.name,
            "objective": variant(config["objective"]),
            "lr": float(config["learner"]["lr"]),
            "k": staleness_label(config["cluster"]),
            "seed": int(config["seed"]),
            "initial": summary["accuracy_initial"],
            "best": summary["accuracy_best"],
            "last": summary["accuracy_final"],
            "staleness": summary["staleness_mean"],
            "wall": summary.get("wall_seconds", float("nan")),
        }
        for key, metric in STEP_STATS.items():
            values = [r[metric] for r in train if metric in r and math.isfinite(r[metric])]
            row[key] = statistics.mean(values) if values else float("nan")
        runs.append(row)
    return runs


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample std; a non-finite value (a weight variance that overflowed) makes both non-finite."""
    if not all(math.isfinite(v) for v in values):
        return float(sum(values)) / len(values), float("nan")
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def cells(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, float, int], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        groups[r["objective"], r["lr"], r["k"]].append(r)
    out = []
    for (objective, lr, k), members in groups.items():
        cell: dict[str, Any] = {"objective": objective, "lr": lr, "k": k, "seeds": sorted(m["seed"] for m in members)}
        for key in ("initial", "best", "last", "staleness", "wall", *STEP_STATS):
            cell[key], cell[key + "_std"] = mean_std([m[key] for m in members])
        cell["collapse"] = sum(m["last"] < m["initial"] for m in members) / len(members)
        out.append(cell)
    return sorted(out, key=lambda c: (c["lr"], c["objective"], c["k"]))


def objective_order(cells_: list[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for c in cells_:
        seen.setdefault(c["objective"])
    return list(seen)


def markdown(cells_: list[dict[str, Any]]) -> str:
    head = (
        "| lr | objective | max staleness | seeds | best acc % | last acc % | collapse | staleness | KL (k3) "
        "| IS-weight var | ESS |\n" + "| --- " * 11 + "|"
    )
    rows = [
        f"| {c['lr']:g} | {c['objective']} | {c['k']} | {len(c['seeds'])} "
        f"| {c['best'] * 100:.1f} ± {c['best_std'] * 100:.1f} | {c['last'] * 100:.1f} ± {c['last_std'] * 100:.1f} "
        f"| {round(c['collapse'] * len(c['seeds']))}/{len(c['seeds'])} | {c['staleness']:.1f} "
        f"| {c['kl']:.3g} | {c['is_var']:.3g} | {c['ess']:.3f} |"
        for c in cells_
    ]
    return head + "\n" + "\n".join(rows) + "\n"


def pivot(cells_: list[dict[str, Any]], stat: str, scale: float = 1.0, fmt: str = ".1f") -> str:
    """One table per learning rate: objectives x max staleness."""
    ks = sorted({c["k"] for c in cells_})
    by = {(c["objective"], c["lr"], c["k"]): c for c in cells_}
    out = []
    for lr in sorted({c["lr"] for c in cells_}):
        out.append(f"\nlr {lr:g}\n\n| objective \\ max staleness | " + " | ".join(str(k) for k in ks) + " |")
        out.append("| --- " * (len(ks) + 1) + "|")
        for objective in objective_order(cells_):
            values = []
            for k in ks:
                c = by.get((objective, lr, k))
                if c is None:
                    values.append("-")
                elif stat == "collapse":
                    values.append(f"{round(c['collapse'] * len(c['seeds']))}/{len(c['seeds'])}")
                elif stat == "last_collapse":  # last accuracy with the collapses in brackets
                    collapsed = round(c["collapse"] * len(c["seeds"]))
                    text = f"{c['last'] * 100:.1f} ± {c['last_std'] * 100:.1f}"
                    values.append(text + (f" ({collapsed})" if collapsed else ""))
                else:
                    values.append(f"{c[stat] * scale:{fmt}}")
            out.append(f"| {objective} | " + " | ".join(values) + " |")
    return "\n".join(out) + "\n"


def plot_accuracy(cells_: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lrs = sorted({c["lr"] for c in cells_})
    ks = sorted({c["k"] for c in cells_})
    objectives = objective_order(cells_)
    colors = plt.get_cmap("tab10")
    fig, axes = plt.subplots(2, len(lrs), figsize=(3.6 * len(lrs), 6.4), dpi=100, sharey=True, squeeze=False)
    initial = statistics.mean(c["initial"] for c in cells_)
    for row, (stat, what) in enumerate((("best", "best"), ("last", "last"))):
        for col, lr in enumerate(lrs):
            ax = axes[row][col]
            for i, objective in enumerate(objectives):
                mine = [c for c in cells_ if c["objective"] == objective and c["lr"] == lr]
                pts = sorted((c["k"], c[stat], c[stat + "_std"]) for c in mine)
                if not pts:
                    continue
                xs = [ks.index(p[0]) + (i - (len(objectives) - 1) / 2) * 0.04 for p in pts]
                ax.errorbar(
                    xs,
                    [p[1] * 100 for p in pts],
                    yerr=[p[2] * 100 for p in pts],
                    label=objective,
                    color=colors(i),
                    marker="o",
                    markersize=4,
                    capsize=2,
                    linewidth=1.2,
                )
            ax.axhline(initial * 100, color="grey", linestyle="--", linewidth=1)
            ax.set_xticks(range(len(ks)), [str(k) for k in ks])
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(f"lr {lr:g}")
            if row == 1:
                ax.set_xlabel("max staleness k (0 = sync)")
            if col == 0:
                ax.set_ylabel(f"{what} held-out accuracy %")
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(plt.Line2D([], [], color="grey", linestyle="--"))
    labels.append("warm start")
    fig.legend(handles, labels, loc="lower center", ncols=min(len(labels), 5), fontsize="medium")
    fig.tight_layout(rect=(0, 0.07 + 0.04 * (len(labels) > 5), 1, 1))
    fig.savefig(path)
    plt.close(fig)


def _ranks(values: list[float]) -> list[float]:
    """Ranks 1..n, ties sharing their mean rank (as Spearman's coefficient needs)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for m in range(i, j + 1):
            ranks[order[m]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def correlations(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Pearson of the values given (logs, here) and Spearman (Pearson of the ranks); NaN if one is constant."""
    if len(set(xs)) < 2 or len(set(ys)) < 2:
        return float("nan"), float("nan")
    return statistics.correlation(xs, ys), statistics.correlation(_ranks(xs), _ranks(ys))


def chain(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Correlations along staleness -> KL -> weight variance over every run (synchronous ones at staleness 0),
    pooled, per learning rate and per objective; logs of KL and variance (they span orders of magnitude)."""
    usable = [r for r in runs if r["kl"] > 0 and r["is_var"] > 0]
    subsets = [("all runs", usable)]
    subsets += [(f"lr {lr:g}", [r for r in usable if r["lr"] == lr]) for lr in sorted({r["lr"] for r in usable})]
    subsets += [(o, [r for r in usable if r["objective"] == o]) for o in objective_order(usable)]
    out: dict[str, Any] = {}
    for name, members in subsets:
        if len(members) < 3:
            continue
        log_kl = [math.log10(r["kl"]) for r in members]
        log_var = [math.log10(r["is_var"]) for r in members]
        stale = [r["staleness"] for r in members]
        out[name] = {
            "runs": len(members),
            "staleness_kl": correlations(stale, log_kl),
            "kl_isvar": correlations(log_kl, log_var),
            "lr_kl": correlations([math.log10(r["lr"]) for r in members], log_kl),
        }
    return out


def plot_chain(runs: list[dict[str, Any]], coefficients: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    objectives = objective_order(runs)
    lrs = sorted({r["lr"] for r in runs})
    markers = ["o", "s", "^", "D", "v", "P"]
    colors = plt.get_cmap("tab10")
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), dpi=100)
    for i, objective in enumerate(objectives):
        for j, lr in enumerate(lrs):
            members = [r for r in runs if r["objective"] == objective and r["lr"] == lr and r["kl"] > 0]
            if not members:
                continue
            style = {"color": colors(i), "marker": markers[j % len(markers)], "s": 16, "alpha": 0.75}
            axes[0].scatter([r["staleness"] for r in members], [r["kl"] for r in members], **style)
            axes[1].scatter([r["kl"] for r in members], [r["is_var"] for r in members], **style)
    pooled = coefficients.get("all runs")
    axes[0].set_xlabel("mean observed staleness (steps)")
    axes[0].set_ylabel("learner–sampler KL (k3, mean over steps)")
    axes[0].set_yscale("log")
    axes[1].set_xlabel("learner–sampler KL (k3, mean over steps)")
    axes[1].set_ylabel("objective's own IS-weight variance (mean over steps)")
    axes[1].set_xscale("log")
    axes[1].set_yscale("log")
    if pooled:
        axes[0].set_title(
            "staleness → KL: Pearson(log) {:.2f}, Spearman {:.2f}".format(*pooled["staleness_kl"]),
            fontsize="medium",
        )
        axes[1].set_title(
            "KL → weight variance: Pearson(log-log) {:.2f}, Spearman {:.2f}".format(*pooled["kl_isvar"]),
            fontsize="medium",
        )
    for ax in axes:
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color=colors(i), marker="o", linestyle="") for i in range(len(objectives))]
    handles += [
        plt.Line2D([], [], color="black", marker=markers[j % len(markers)], linestyle="") for j in range(len(lrs))
    ]
    labels = objectives + [f"lr {lr:g}" for lr in lrs]
    fig.legend(handles, labels, loc="lower center", ncols=min(len(labels), 7), fontsize="medium")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="a sweep's output directory")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = load_runs(args.root)
    if not runs:
        raise SystemExit(f"no finished runs under {args.root}")
    table = cells(runs)
    coefficients = chain(runs)
    args.out.mkdir(parents=True, exist_ok=True)
    parts = [
        f"# {args.root.name}: {len(runs)} runs, {len(table)} cells\n",
        "## Every cell (mean ± std over seeds; collapse = runs ending below their warm start)\n",
        markdown(table),
        "## Last accuracy, % (mean ± std; in brackets the runs that ended below the warm start)\n",
        pivot(table, "last_collapse"),
        "## Best accuracy, %\n",
        pivot(table, "best", 100.0),
        "## Collapse (runs ending below the warm start / runs)\n",
        pivot(table, "collapse"),
        "## Learner–sampler KL (k3)\n",
        pivot(table, "kl", fmt=".3g"),
        "## Importance-weight variance (each objective's own weights)\n",
        pivot(table, "is_var", fmt=".3g"),
        "## ESS\n",
        pivot(table, "ess", fmt=".3f"),
        "## Chain correlations (Pearson of logs / Spearman; synchronous runs at staleness 0)\n",
        "| runs | n | staleness → log KL | log KL → log IS var | log lr → log KL |\n| --- | --- | --- | --- | --- |",
        "\n".join(
            f"| {name} | {c['runs']} | {c['staleness_kl'][0]:.2f} / {c['staleness_kl'][1]:.2f} "
            f"| {c['kl_isvar'][0]:.2f} / {c['kl_isvar'][1]:.2f} | {c['lr_kl'][0]:.2f} / {c['lr_kl'][1]:.2f} |"
            for name, c in coefficients.items()
        )
        + "\n",
    ]
    text = "\n".join(parts)
    (args.out / "cells.md").write_text(text)
    (args.out / "cells.json").write_text(json.dumps({"cells": table, "chain": coefficients}, indent=1))
    plot_accuracy(table, args.out / "accuracy_vs_staleness.png")
    plot_chain(runs, coefficients, args.out / "chain.png")
    print(text)


if __name__ == "__main__":
    main()
