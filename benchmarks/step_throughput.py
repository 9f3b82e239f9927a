"""Seconds per RL step, split into generate / train / sync / verify / other, and heterorl side by side with TRL.

    PYTHONPATH=<trl site> .venv/bin/python benchmarks/step_throughput.py          # everything, one command
    .venv/bin/python benchmarks/step_throughput.py --repeats 3 --steps 20 --no-trl

1. The demo (configs/demo.yaml: 3 samplers at 1x / 0.5x / 0.25x, log-normal 60-1800 s weight delays at 100 Mbps,
   GEPO) in sync and async mode: seconds per learner step by phase (`step_trials.py` says what each phase holds).
2. The same work under heterorl and TRL's GRPOTrainer (when `trl` imports, the `bench` extra): the demo's warm-start
   model in fp32, the prompts of the addition task's stream in order, the task's verifier as the reward, G = 8,
   16 prompts per step, GRPO (clip 0.2, group-std advantages, per-sequence token mean), AdamW as the learner's,
   one torch thread; heterorl as a synchronous run with one sampler on an ideal link (nothing travels), TRL
   without gradient checkpointing (its default recomputes activations; heterorl does not). Both with heterorl's
   defaults (its rollout verifier re-scores 10% of the groups: the verify column), and heterorl again with
   `learner.share_prompt` (opt-in; not bit-identical to the padded batch).

Every trial is a fresh process (`step_trials.py`), the frameworks interleaved (H T T H H T ...), each trial's first
steps left out; the tables give the median over trials of each trial's mean seconds per step, wall and process
CPU (all threads: heterorl's background publish counts), and the load average before and after.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
TRIALS = Path(__file__).resolve().parent / "step_trials.py"
DEMO = REPO / "configs" / "demo.yaml"
SYNC = ["cluster.mode=sync", "cluster.max_staleness=null"]
IDEAL = [*SYNC, "cluster.samplers=[{}]", "objective.name=grpo", "eval.every=100000"]  # one sampler, ideal link
PHASES = ("generate", "train", "sync", "verify", "other")
# Model sizes (`--model`): the demo's warm-started 0.3M model, or Qwen3-style models of ~10M / ~100M parameters
# with the addition task's tokenizer after a single warm-start step (untrained: `--dense-reward` gives their
# groups reward spread, so that every step is a real optimizer step).
MODELS = {
    "demo": [],
    "10m": ["model.hidden_size=256", "model.num_layers=12", "model.num_heads=4", "model.num_kv_heads=2"],
    "100m": ["model.hidden_size=768", "model.num_layers=14", "model.num_heads=12", "model.num_kv_heads=4"],
}
MODELS["10m"] += ["model.intermediate_size=768", "pretrain.max_steps=1"]
MODELS["100m"] += ["model.intermediate_size=2304", "pretrain.max_steps=1"]
DENSE = ["task.reward=heterorl.bench.rewards:partial_answer"]


def trial(framework: str, overrides: list[str], steps: int, warmup: int) -> dict[str, Any]:
    """One fresh process running `step_trials.py`; its JSON result."""
    cmd = [sys.executable, str(TRIALS), framework, "--config", str(DEMO), "--steps", str(steps)]
    cmd += ["--warmup", str(warmup), *[a for o in overrides for a in ("--set", o)]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{framework} trial failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def median_split(results: list[dict[str, Any]], clock: str) -> dict[str, float]:
    keys = results[0][clock].keys()
    return {k: statistics.median(r[clock][k] for r in results) for k in keys}


def phase_table(title: str, rows: dict[str, list[dict[str, Any]]]) -> Table:
    table = Table(title=title)
    for col in ("run", "clock", "total s/step", *PHASES, "sync share", "eval (left out)"):
        table.add_column(col, justify="right")
    for name, results in rows.items():
        for clock in ("wall", "cpu"):
            m = median_split(results, clock)
            cells = [f"{m[p] * 1000:.1f} ms" if p in m else "-" for p in PHASES]
            share = f"{m['sync'] / m['total']:.1%}" if "sync" in m else "-"
            evaluated = m.get("eval (excluded)")
            table.add_row(
                name, clock, f"{m['total']:.4f}", *cells, share, "-" if evaluated is None else f"{evaluated * 1000:.1f}"
            )
    return table


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def conditions() -> str:
    import torch
    import transformers

    trl = importlib.util.find_spec("trl")
    trl_version = "not installed"
    if trl is not None:
        import trl as trl_module

        trl_version = trl_module.__version__
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, trl {trl_version}, heterorl {rev.stdout.strip()}, "
        "one torch thread per process"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30, help="measured steps per trial")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out at the start of each trial")
    parser.add_argument("--repeats", type=int, default=5, help="trials per variant (interleaved)")
    parser.add_argument("--no-trl", action="store_true", help="skip the TRL comparison")
    parser.add_argument("--no-demo", action="store_true", help="skip the demo's phase table")
    parser.add_argument("--json", type=Path, help="also write every trial's result here")
    parser.add_argument("--model", choices=sorted(MODELS), default="demo", help="model size of the side by side")
    parser.add_argument("--new-tokens", type=int, help="completion length (default: the demo's 6)")
    parser.add_argument("--lr", type=float, help="learning rate (default: the demo's 1e-4)")
    parser.add_argument("--dense-reward", action="store_true", help="partial-credit reward (heterorl.bench.rewards)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="more dotted.key=value")
    args = parser.parse_args()
    extra = [*MODELS[args.model], *(DENSE if args.dense_reward else []), *args.overrides]
    if args.new_tokens:
        extra += [f"sampler.max_new_tokens={args.new_tokens}", f"model.max_positions={args.new_tokens + 32}"]
    if args.lr:
        extra += [f"learner.lr={args.lr}"]
    console = Console(width=150)
    if extra:
        console.print(f"overrides: {' '.join(extra)}")
    console.print(f"[bold]conditions[/bold]: {conditions()}")
    console.print(f"load average (1 / 5 / 15 min) at start: {load()}")
    started = time.monotonic()
    variants: dict[str, tuple[str, list[str]]] = {}
    if not args.no_demo:
        variants["demo sync"] = ("heterorl", SYNC)
        variants["demo async"] = ("heterorl", [])
    trl_ok = not args.no_trl and importlib.util.find_spec("trl") is not None
    if not args.no_trl and not trl_ok:
        console.print("[yellow]trl is not installed (the `bench` extra): no side-by-side[/yellow]")
    if trl_ok:
        variants["heterorl"] = ("heterorl", [*IDEAL, *extra])
        variants["heterorl share_prompt"] = ("heterorl", [*IDEAL, *extra, "learner.share_prompt=true"])
        variants["TRL GRPOTrainer"] = ("trl", [*IDEAL, *extra])
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.repeats):
        for name in names if r % 2 == 0 else names[::-1]:  # interleaved, alternating order
            framework, overrides = variants[name]
            results[name].append(trial(framework, overrides, args.steps, args.warmup))
            wall = results[name][-1]["wall"]["total"]
            console.print(f"  trial {r + 1}/{args.repeats} {name:22s} {wall:.4f} s/step (load {load()})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    demo = {k: v for k, v in results.items() if k.startswith("demo")}
    if demo:
        console.print(phase_table(f"demo, seconds per learner step (median of {args.repeats} trials)", demo))
    if trl_ok:
        side = {k: v for k, v in results.items() if not k.startswith("demo")}
        console.print(phase_table("the same work: heterorl vs TRL GRPOTrainer (median of trials)", side))
        trl_m = {c: median_split(results["TRL GRPOTrainer"], c)["total"] for c in ("wall", "cpu")}
        for name in ("heterorl", "heterorl share_prompt"):
            ours = {c: median_split(results[name], c)["total"] for c in ("wall", "cpu")}
            rewards = statistics.mean(r["reward"] for r in results[name])
            publish = statistics.median(1 - r["thread"]["total"] / r["cpu"]["total"] for r in results[name])
            console.print(
                f"[bold]{name}[/bold]: publish (the background thread) {publish:.1%} of the process CPU; "
                f"vs TRL: {trl_m['wall'] / ours['wall']:.2f}x wall, "
                f"{trl_m['cpu'] / ours['cpu']:.2f}x CPU per step (TRL / heterorl; mean batch reward {rewards:.3f} "
                f"vs TRL's {statistics.mean(r['reward'] for r in results['TRL GRPOTrainer']):.3f})"
            )
    console.print(f"load average at end: {load()}; {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
