"""A markdown pivot table of a sweep: one row per value of one config key, one column per value of another,
each cell the mean over seeds of a run statistic.

Statistics: any summary.json key (e.g. `accuracy_best`, `accuracy_final`, `staleness_mean`), or `mean:KEY` /
`last:KEY` of a metrics.jsonl key over the learner steps (e.g. `mean:obj/kl_k3`, `mean:obj/is_weight_var`), or
`error_final` (1 - final accuracy) and `drop_best` (best accuracy of the cell minus that of the column given by
--reference, in points).

    .venv/bin/python benchmarks/pivot.py runs/gepo-delay --rows objective.name --cols cluster.max_staleness \
        --stat accuracy_best --percent
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from heterorl.metrics import read_metrics


def lookup(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def run_stat(run: Path, stat: str) -> float:
    summary = json.loads((run / "summary.json").read_text())
    if stat == "error_final":
        return 1.0 - summary["accuracy_final"]
    if ":" in stat:
        how, key = stat.split(":", 1)
        values = [r[key] for r in read_metrics(run / "metrics.jsonl") if r.get("kind") == "train" and key in r]
        return statistics.mean(values) if how == "mean" else values[-1]
    return float(summary[stat])


def label(value: Any) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items() if k != "kind")
    return "null" if value is None else str(value)


def bar_chart(table: dict[str, list[float]], columns: list[str], ylabel: str, path: Path) -> None:
    """One group of bars per column, one bar (colour) per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    x = np.arange(len(columns))
    width = 0.8 / max(len(table), 1)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.7 * len(columns)), 4), dpi=100)
    for i, (row, values) in enumerate(table.items()):
        ax.bar(x + (i - (len(table) - 1) / 2) * width, values, width, label=row)
    ax.set_xticks(x, columns)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(ncols=min(len(table), 5), fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def order(text: str) -> tuple[int, float | str]:
    """null first, then numbers ascending, then the rest alphabetically."""
    if text == "null":
        return (0, 0.0)
    try:
        return (1, float(text))
    except ValueError:
        return (2, text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path)
    parser.add_argument("--rows", required=True)
    parser.add_argument("--cols", required=True, help="one key, or several comma-separated keys")
    parser.add_argument("--stat", default="accuracy_best")
    parser.add_argument("--percent", action="store_true", help="show fractions as percentages")
    parser.add_argument("--fmt", default=".3g")
    parser.add_argument("--bar", type=Path, default=None, help="also draw the table as a grouped bar chart (PNG)")
    parser.add_argument("--col-labels", default=None, help="comma-separated display names of the columns")
    parser.add_argument("--title", default=None)
    args = parser.parse_args()
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    rows: list[str] = []
    cols: list[str] = []
    for run in sorted(p.parent for p in args.root.glob("*/summary.json")):
        config = yaml.safe_load((run / "config.yaml").read_text())
        r = label(lookup(config, args.rows))
        c = " ".join(f"{k.split('.')[-1]}={label(lookup(config, k))}" for k in args.cols.split(","))
        c = c.split("=", 1)[1] if "," not in args.cols else c  # one key: just its value
        rows += [r] if r not in rows else []
        cols += [c] if c not in cols else []
        cells[r, c].append(run_stat(run, args.stat))
    cols.sort(key=order)
    scale = 100.0 if args.percent else 1.0
    print(f"| {args.rows} \\ {args.cols} | " + " | ".join(cols) + " |")
    print("| --- " * (len(cols) + 1) + "|")
    for r in rows:
        values = []
        for c in cols:
            v = cells.get((r, c))
            values.append(f"{statistics.mean(v) * scale:{args.fmt}} (n={len(v)})" if v else "-")
        print(f"| {r} | " + " | ".join(values) + " |")
    if args.bar is not None:
        names = args.col_labels.split(",") if args.col_labels else cols
        table = {
            r: [statistics.mean(cells[r, c]) * scale if cells.get((r, c)) else float("nan") for c in cols] for r in rows
        }
        bar_chart(table, names, args.title or args.stat, args.bar)


if __name__ == "__main__":
    main()
