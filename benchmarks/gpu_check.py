"""One table for a machine with one NVIDIA GPU and 16 cores: codec speed at 1, 2 and 16 threads, and a ~100M step.

    .venv/bin/python benchmarks/gpu_check.py            # ~3-4 min; this repo, its .venv with CUDA torch and the
                                                        # compiled codec kernels (`pip install -e .` builds them)
    .venv/bin/python benchmarks/gpu_check.py --smoke    # CPU, small sizes: checks that the script runs (~1 min)

1. Codec: both PULSE formats on the synthetic 70M step and a real Qwen3 ~90M AdamW step (lr 1e-6), encode and
   checked decode in GB/s of bf16 model bytes per CPU-second and per wall second, compiled kernels vs the numpy
   reference, at 1, 2 and 16 threads
   (`benchmarks/codec_speed.py`, heterorl/bench/codec.py).
2. Step: a synchronous GRPO step of a ~97M-parameter Qwen3-style model (hidden 768, 14 layers, the addition task's
   tokenizer, one warm-start step) on the GPU with the transformers engine, one sampler on an ideal link,
   16 groups of 8, 6 new tokens; at `weights.codec_threads` 1 and 16. Seconds per step by phase (generate, train,
   sync) from `benchmarks/step_trials.py` (fresh process each), and the publish's share of the process CPU
   (process CPU minus main-thread CPU: the background publish is the only other busy thread).
Everything prints as it goes; the load average is printed with every row.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from heterorl.bench.codec import HEADER, codec_rows, thread_speedups  # noqa: E402
from heterorl.weights import native  # noqa: E402

MODEL_100M = [
    "model.hidden_size=768",
    "model.num_layers=14",
    "model.num_heads=12",
    "model.num_kv_heads=4",
    "model.intermediate_size=2304",
    "pretrain.max_steps=1",
]
STEP = ["cluster.mode=sync", "cluster.max_staleness=null", "cluster.samplers=[{}]", "objective.name=grpo"]
STEP += ["eval.every=100000", "task.eval_size=16"]


def conditions() -> str:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    return (
        f"{gpu}; {cpu}, {os.cpu_count()} cores; torch {torch.__version__}; codec kernels built: {native.BUILT} "
        f"({native.LEVEL} loops); "
        f"load average {os.getloadavg()[0]:.2f}"
    )


def step_trial(overrides: list[str], steps: int, warmup: int, cache: str) -> dict:
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "step_trials.py"),
        "heterorl",
        "--config",
        str(REPO / "configs" / "demo.yaml"),
    ]
    cmd += ["--steps", str(steps), "--warmup", str(warmup), *[a for o in overrides for a in ("--set", o)]]
    env = {**os.environ, "HETERORL_CACHE": cache, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"step trial failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="CPU, small sizes: check that the script runs")
    args = parser.parse_args()
    started = time.monotonic()
    print(conditions(), flush=True)
    threads = [1, 2] if args.smoke else [1, 2, 16]
    print("\n== codec: kernels vs numpy reference (GB = bf16 model bytes; CPU-seconds unless 'wall') ==")
    print(HEADER + "\n" + "-" * len(HEADER), flush=True)
    steps = ["synthetic"] if args.smoke else ["synthetic", "qwen3"]
    rows = codec_rows(steps, threads, repeats=3, num_params=4_000_000 if args.smoke else 70_000_000)
    for line in thread_speedups(rows):
        print(line)
    print(
        f"\n== step: ~97M Qwen3-style, synchronous GRPO, transformers engine on {'CPU' if args.smoke else 'the GPU'} =="
    )
    model = [] if args.smoke else [*MODEL_100M, "model.device=cuda"]
    steps, warmup = (3, 1) if args.smoke else (8, 2)
    header = f"{'codec threads':>13s} {'s/step':>8s} {'generate':>9s} {'train':>8s} {'sync':>8s} {'CPU s/step':>10s}"
    header += f" {'publish CPU':>11s} {'load':>5s}"
    print(header + "\n" + "-" * len(header), flush=True)
    with tempfile.TemporaryDirectory() as cache:
        for n in sorted({threads[0], threads[-1]}):
            r = step_trial([*STEP, *model, f"weights.codec_threads={n}"], steps, warmup, cache)
            wall, cpu, thread = r["wall"], r["cpu"], r["thread"]
            publish = (cpu["total"] - thread["total"]) / cpu["total"]
            print(
                f"{n:13d} {wall['total']:8.3f} {wall['generate']:9.3f} {wall['train']:8.3f} {wall['sync']:8.3f} "
                f"{cpu['total']:10.3f} {publish:11.1%} {os.getloadavg()[0]:5.2f}",
                flush=True,
            )
    print(f"\ndone in {time.monotonic() - started:.0f} s; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
