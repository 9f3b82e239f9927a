"""Virtual time to reach a target held-out accuracy, per run group (AReaL's end-to-end comparison).

For every run the first evaluation whose accuracy reaches the target gives the virtual time (and learner step)
at which it was reached; groups are runs with equal configs but the seed. Runs that never reach it count as
not reached.

    .venv/bin/python benchmarks/time_to_target.py runs/areal-time-to-target --gain 0.15 --key cluster.mode
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

import yaml

from heterorl.metrics import read_metrics


def first_reach(run_dir: Path, target: float, gain: float | None) -> tuple[float, int] | None:
    """(virtual seconds, learner step) of the first evaluation at or above the target, None if never. With
    `gain`, the target is the run's initial accuracy + gain (seeds whose base models differ compare fairly)."""
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind") == "eval"]
    if gain is not None:
        target = evals[0]["eval/accuracy"] + gain
    for r in evals:
        if r["eval/accuracy"] >= target:
            return r["time/clock"], r["step"]
    return None


def plot_curves(curves: dict[str, list[tuple[list[float], list[float]]]], key: str, path: Path) -> None:
    """Held-out accuracy against virtual hours, one line per run, one colour per group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for colour, (name, runs) in zip(("tab:blue", "tab:orange", "tab:green", "tab:red"), curves.items(), strict=False):
        for i, (hours, acc) in enumerate(runs):
            ax.plot(hours, acc, color=colour, alpha=0.8, marker=".", label=f"{key}={name}" if i == 0 else None)
    ax.set(xlabel="virtual time (hours)", ylabel="held-out greedy accuracy", title="Accuracy vs virtual time")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def lookup(config: dict, dotted: str) -> object:
    node: object = config
    for part in dotted.split("."):
        node = node[part]  # type: ignore[index]
    return node


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path, help="a sweep's output directory")
    parser.add_argument("--target", type=float, default=0.75)
    parser.add_argument("--gain", type=float, default=None, help="instead: initial accuracy + this, per run")
    parser.add_argument("--key", default="cluster.mode", help="config key that names the groups")
    parser.add_argument("--plot", type=Path, default=None, help="also plot accuracy vs virtual time (PNG)")
    args = parser.parse_args()
    groups: dict[str, list[tuple[float, int] | None]] = defaultdict(list)
    curves: dict[str, list[tuple[list[float], list[float]]]] = defaultdict(list)
    for run in sorted(p.parent for p in args.root.glob("*/summary.json")):
        config = yaml.safe_load((run / "config.yaml").read_text())
        name = str(lookup(config, args.key))
        groups[name].append(first_reach(run, args.target, args.gain))
        evals = [r for r in read_metrics(run / "metrics.jsonl") if r.get("kind") == "eval"]
        curves[name].append(([r["time/clock"] / 3600 for r in evals], [r["eval/accuracy"] for r in evals]))
    if args.plot is not None:
        plot_curves(curves, args.key, args.plot)
    goal = f"+{args.gain * 100:.0f} points" if args.gain is not None else f"{args.target:.0%}"
    print(f"| {args.key} | runs | reached | virtual s to {goal} (mean ± std) | learner steps (mean) |")
    print("| --- | --- | --- | --- | --- |")
    means = {}
    for name, hits in groups.items():
        reached = [h for h in hits if h is not None]
        times = [t for t, _ in reached]
        if times:
            means[name] = statistics.mean(times)
            spread = statistics.stdev(times) if len(times) > 1 else 0.0
            steps = statistics.mean(s for _, s in reached)
            print(f"| {name} | {len(hits)} | {len(reached)} | {means[name]:.0f} ± {spread:.0f} | {steps:.0f} |")
        else:
            print(f"| {name} | {len(hits)} | 0 | not reached | - |")
    if len(means) == 2:
        (slow, t_slow), (fast, t_fast) = sorted(means.items(), key=lambda kv: -kv[1])
        print(f"\n{fast} reaches {goal} {t_slow / t_fast:.2f}x sooner than {slow} (virtual time)")


if __name__ == "__main__":
    main()
