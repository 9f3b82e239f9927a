"""A synchronous RL step with each rollout engine, transformers and vLLM, on engine_throughput's ~100M Qwen3.

The same work for both: a synchronous run (one sampler on an ideal link, GRPO, the learner's default AdamW at lr
1e-4) on the `qwen3-100m` model (103M parameters, 151,936-token vocabulary, fp32) with the addition task's prompts
and a dense reward (`vowel_share`: every completion scores, so every step changes the weights), G completions of up
to L new tokens for B prompts per step; the sampler loads every version the learner publishes (a full bf16
snapshot). Each trial is a fresh process (`step_trials.heterorl_trial`, the same phase split as
`step_throughput.py`: generate / train / sync / other), the engines interleaved (T V V T ...), each trial's first
step left out. Seconds per step are wall and CPU of the whole process tree (vLLM's engine core and worker
included), held-out evaluation left out of both; the load average is printed with every trial.

    .venv-vllm/bin/python benchmarks/engine_step.py                        # L = 128, both engines
    .venv-vllm/bin/python benchmarks/engine_step.py --max-new-tokens 6     # the short completions of issue 26
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
VOWELS = frozenset("aeiouyAEIOUY")


def vowel_share(prompt: str, completion: str, answer: str, **info: Any) -> float:
    """A dense reward for a random model: the share of letters in the completion that are vowels (0 without any)."""
    del prompt, answer, info
    letters = [c for c in completion if c.isalpha()]
    return sum(c in VOWELS for c in letters) / len(letters) if letters else 0.0


def overrides(args: argparse.Namespace, model: Path) -> list[str]:
    return [
        "cluster.mode=sync",
        "cluster.max_staleness=null",
        "cluster.samplers=[{}]",
        "objective.name=grpo",
        "eval.every=100000",
        "task.eval_size=8",
        f"model.path={model}",
        "task.reward=engine_step:vowel_share",
        f"sampler.engine.name={args.engine}",
        f"sampler.group_size={args.group_size}",
        f"sampler.max_new_tokens={args.max_new_tokens}",
        f"learner.groups_per_step={args.prompts}",
        "learner.lr=1e-4",
        f"learner.steps={args.warmup + args.steps}",
        "weights.codec=full",
    ]


def tree_cpu() -> float:
    """User + system CPU seconds of this process and every process under it."""
    total = 0.0
    for p in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def run_trial(args: argparse.Namespace) -> None:
    """One trial in this process: step_trials' heterorl trial, with the process tree's CPU at every step end."""
    import torch

    import step_trials
    from engine_throughput import build
    from heterorl.config import load_config

    if args.threads:
        torch.set_num_threads(args.threads)
    model = build("qwen3-100m", 2, 32).path
    cfg = load_config(HERE.parent / "configs" / "demo.yaml", overrides(args, model))
    tree: list[float] = []
    mark = step_trials.StepLog.mark

    def mark_with_tree(self: step_trials.StepLog) -> None:
        mark(self)
        tree.append(tree_cpu())

    step_trials.StepLog.mark = mark_with_tree  # type: ignore[method-assign]
    out = step_trials.heterorl_trial(cfg, args.warmup)
    per_step = (tree[-1] - tree[args.warmup]) / (len(tree) - 1 - args.warmup)
    out["tree_cpu"] = per_step - out["cpu"]["eval (excluded)"]  # the run's last evaluation, in this process
    print(json.dumps(out))


def trial(args: argparse.Namespace, engine: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--trial", "--engine", engine]
    for key in ("steps", "warmup", "prompts", "group_size", "max_new_tokens", "threads"):
        value = getattr(args, key)
        if value is not None:
            cmd += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=HERE.parent)
    if done.returncode != 0:
        raise SystemExit(f"{engine} trial failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="transformers,vllm", help="comma-separated: transformers, vllm")
    parser.add_argument("--repeats", type=int, default=2, help="trials per engine (interleaved)")
    parser.add_argument("--steps", type=int, default=2, help="measured steps per trial")
    parser.add_argument("--warmup", type=int, default=1, help="steps left out at the start of each trial")
    parser.add_argument("--prompts", type=int, default=2, help="B: prompts (groups) per step")
    parser.add_argument("--group-size", type=int, default=8, help="G: completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="L: completion length limit")
    parser.add_argument("--threads", type=int, help="torch threads of the trial process (default: torch's)")
    parser.add_argument("--json", type=Path, help="also write every trial's result here")
    parser.add_argument("--trial", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        run_trial(args)
        return
    engines = args.engines.split(",")
    print(f"B={args.prompts} G={args.group_size} L={args.max_new_tokens}, {args.steps} measured steps per trial")
    results: dict[str, list[dict[str, Any]]] = {e: [] for e in engines}
    started = time.monotonic()
    for r in range(args.repeats):
        for engine in engines if r % 2 == 0 else engines[::-1]:
            load = os.getloadavg()[0]
            results[engine].append(trial(args, engine))
            res = results[engine][-1]
            print(
                f"  trial {r + 1}/{args.repeats} {engine:12s} {res['wall']['total']:.2f} s/step wall, "
                f"{res['tree_cpu']:.2f} CPU-s/step (generate {res['wall']['generate']:.2f}, "
                f"train {res['wall']['train']:.2f}, sync {res['wall']['sync']:.2f} s wall); "
                f"1-min load {load:.1f} -> {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(f"\nmedian over trials of each trial's mean per step ({time.monotonic() - started:.0f} s in all)")
    print(f"{'engine':12s} {'wall s':>8} {'CPU s':>8} {'generate':>9} {'train':>7} {'sync':>7} {'other':>7}")
    for engine, runs in results.items():
        m = {k: statistics.median(r["wall"][k] for r in runs) for k in ("total", "generate", "train", "sync", "other")}
        cpu = statistics.median(r["tree_cpu"] for r in runs)
        print(
            f"{engine:12s} {m['total']:8.2f} {cpu:8.2f} {m['generate']:9.2f} {m['train']:7.2f} {m['sync']:7.2f} "
            f"{m['other']:7.2f}"
        )
    if len(results) == 2 and "vllm" in results and "transformers" in results:
        ratio = [
            t["wall"]["total"] / v["wall"]["total"]
            for t, v in zip(results["transformers"], results["vllm"], strict=True)
        ]
        cpu = [t["tree_cpu"] / v["tree_cpu"] for t, v in zip(results["transformers"], results["vllm"], strict=True)]
        print(
            f"transformers / vLLM seconds per step: {statistics.median(ratio):.2f}x wall "
            f"(trials {' '.join(f'{x:.2f}' for x in ratio)}), {statistics.median(cpu):.2f}x CPU "
            f"(trials {' '.join(f'{x:.2f}' for x in cpu)})"
        )


if __name__ == "__main__":
    main()
