"""Seconds per weight update of the vLLM engine: `VLLMEngine.load_weights` of a full bf16 snapshot, as a sampler
does after every learner step.

The model is engine_throughput's `qwen3-100m` (103M parameters, 151,936-token vocabulary, fp32 in vLLM); the
updates alternate between two weight sets that differ in every element, each a new version, with `--in-flight`
completions being generated at each update (they are interrupted and continued, as in a run). Wall seconds and
CPU seconds (this process and the engine's own processes) per update, the median over `--updates`, and the
1-minute load average.

    .venv-vllm/bin/python benchmarks/engine_update.py
    PYTHONPATH=<other checkout>/src .venv-vllm/bin/python benchmarks/engine_update.py   # another version's engine
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import psutil
import torch

import heterorl
from engine_throughput import build, cpu_seconds, new_children, text_format
from heterorl.config import VLLMEngineConfig
from heterorl.engines.vllm_engine import VLLMEngine
from heterorl.policy import Policy, SamplingParams, run_process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=8, help="timed updates")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="vLLM's compute dtype")
    parser.add_argument(
        "--in-flight", type=int, default=0, help="completions being generated at each update (0: none, clean CPU-s)"
    )
    args = parser.parse_args()
    print(f"heterorl from {os.path.dirname(heterorl.__file__)}")
    bench = build("qwen3-100m", 2, 32)
    text = text_format(bench.path)
    policy = Policy.load(bench.path)
    weights = [{n: p.detach().to(torch.bfloat16).clone() for n, p in policy.model.named_parameters()}]
    gen = torch.Generator().manual_seed(0)
    weights.append(
        {n: (w.float() * (1 + 0.01 * torch.randn(w.shape, generator=gen))).bfloat16() for n, w in weights[0].items()}
    )
    n_params = sum(w.numel() for w in weights[0].values())
    cfg = VLLMEngineConfig(max_num_seqs=64, max_model_len=32 + 64 + 8)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    engine = VLLMEngine(bench.path, cfg, eos_id=text.eos_id, pad_id=text.pad_id, seed=0, dtype=args.dtype)
    procs = new_children(before)
    walls, cpus, loads = [], [], []
    try:
        engine.load_weights(0, weights[0])
        ids, mask = text.encode_prompts(bench.prompts[:1])
        for version in range(1, args.updates + 2):  # the first update is a warm-up
            process = None
            if args.in_flight:
                process = engine.generate(ids, mask, args.in_flight, SamplingParams(max_new_tokens=64))
                next(process)
                next(process)  # the requests are running
            loads.append(os.getloadavg()[0])
            cpu, start = cpu_seconds(procs), time.perf_counter()
            engine.load_weights(version, weights[version % 2])
            if version > 1:
                walls.append(time.perf_counter() - start)
                cpus.append(cpu_seconds(procs) - cpu)
                phases = {k: round(v, 3) for k, v in engine.last_update.items() if k.endswith("_s")}
                print(f"update {version}: {walls[-1]:.3f} s wall, {cpus[-1]:.3f} CPU-s {phases}")
            if process is not None:
                run_process(process)  # the completions finish under the new version
    finally:
        engine.close()
    print(
        f"{n_params / 1e6:.1f}M parameters ({sum(w.numel() * 2 for w in weights[0].values()) / 1e6:.0f} MB bf16), "
        f"vLLM in {args.dtype}, "
        f"{args.in_flight} completions in flight: update {statistics.median(walls):.3f} s wall "
        f"(min {min(walls):.3f}, max {max(walls):.3f}), {statistics.median(cpus):.3f} CPU-s, over {len(walls)} "
        f"updates; 1-min load {min(loads):.1f}-{max(loads):.1f}"
    )


if __name__ == "__main__":
    main()
