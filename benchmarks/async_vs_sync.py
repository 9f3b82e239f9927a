"""Asynchronous (HeteroRL/AReaL) vs synchronous RL on the same simulated cluster, in one invocation.

Three samplers at 1x / 0.5x / 0.25x speed and one learner (configs/demo.yaml). For each network setting the same
config runs once with `cluster.mode=async` and once with `cluster.mode=sync`; we report the virtual time to
complete N learner steps, the speed-up, and held-out greedy accuracy after N steps.

    .venv/bin/python benchmarks/async_vs_sync.py --steps 200 --seeds 0 1

Networks: `datacenter` (no link delay: the AReaL setting, where the gain comes from not waiting for the slowest
sampler and from overlapping generation with training) and `wan` (the demo's log-normal 60-1800 s weight
delays: a synchronous step also pays the slowest weight transfer).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from heterorl.config import load_config
from heterorl.simulated.run import execute

REPO = Path(__file__).resolve().parents[1]
NETWORKS = {
    "datacenter": [f"cluster.samplers.{i}.link.weights_delay={{kind: fixed, seconds: 0}}" for i in range(3)],
    "wan": [],  # the demo's links as configured
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "demo.yaml")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS), choices=list(NETWORKS))
    args = parser.parse_args()
    console = Console()
    table = Table(title=f"async vs sync, {args.steps} learner steps, samplers 1x/0.5x/0.25x")
    for col in ("network", "mode", "virtual time (s)", "speed-up", "accuracy after N", "mean staleness", "wall (s)"):
        table.add_column(col, justify="right")
    with tempfile.TemporaryDirectory() as tmp:
        for network in args.networks:
            results: dict[str, list[dict]] = {"sync": [], "async": []}
            for mode in ("sync", "async"):
                for seed in args.seeds:
                    overrides = [f"cluster.mode={mode}", f"learner.steps={args.steps}", f"seed={seed}"]
                    overrides += NETWORKS[network]
                    if mode == "sync":
                        overrides.append("cluster.max_staleness=null")
                    cfg = load_config(args.config, overrides)
                    run_dir = Path(tmp) / f"{network}-{mode}-{seed}"
                    results[mode].append(execute(cfg, run_dir, show_progress=False))
                    s = results[mode][-1]
                    console.print(
                        f"{network:10s} {mode:5s} seed {seed}: {s['clock_seconds']:.0f} virtual s, "
                        f"accuracy {s['accuracy_initial']:.3f} -> {s['accuracy_final']:.3f}"
                    )
            t_sync = statistics.mean(r["clock_seconds"] for r in results["sync"])
            for mode in ("sync", "async"):
                rs = results[mode]
                t = statistics.mean(r["clock_seconds"] for r in rs)
                table.add_row(
                    network,
                    mode,
                    f"{t:.0f}",
                    f"{t_sync / t:.2f}x",
                    f"{statistics.mean(r['accuracy_final'] for r in rs):.3f}",
                    f"{statistics.mean(r['staleness_mean'] for r in rs):.2f}",
                    f"{statistics.mean(r['rl_wall_seconds'] for r in rs):.0f}",
                )
    console.print(table)


if __name__ == "__main__":
    main()
