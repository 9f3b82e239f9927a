"""PULSE encode on the GPU where the weights live, against the CPU encode of the same step, in one command.

    python benchmarks/pulse_gpu.py                      # noise 1e8 + Qwen3 ~90M steps, both formats
    python benchmarks/pulse_gpu.py --params 1e9 --steps noise

For each step: encode GB/s of v1 ("pulse") and v2 ("pulse-ctx") on the CPU and on the GPU (best of 3, the
GPU synchronised; the base hash given, as the store gives it, the new hash computed from a host copy), the GPU
patches checked byte-identical to the CPU ones and applied (checked decode on the CPU), and a WeightStore with
device="cuda" publishing the step (cast, diff, classify, encode). GB = bf16 model bytes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from heterorl.bench.steps import step_pair
from heterorl.weights import WeightStore, apply_patch, make_codec, state_hash
from heterorl.weights.patch import encode_patches


def best(fn, repeats: int = 3, sync: bool = False) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_step(label: str, base: dict, new: dict) -> None:
    nbytes = 2 * sum(t.numel() for t in base.values())
    base_hash = state_hash(base)
    gpu_base = {k: v.cuda() for k, v in base.items()}
    gpu_new = {k: v.cuda() for k, v in new.items()}
    print(f"\n{label}: {nbytes // 2:,} parameters, load average {os.getloadavg()[0]:.2f}", flush=True)
    for fmt, name in ((1, "pulse (v1)"), (2, "pulse-ctx (v2)")):

        def run(b, n, fmt=fmt):
            return encode_patches(b, n, hashes=(base_hash, None), formats=(fmt,))[fmt - 1]

        cpu_s = best(lambda: run(base, new))
        gpu_s = best(lambda: run(gpu_base, gpu_new), sync=True)
        cpu_patch, gpu_patch = run(base, new), run(gpu_base, gpu_new)
        assert gpu_patch == cpu_patch, f"{name}: GPU and CPU patches differ"
        weights = {k: v.clone() for k, v in base.items()}
        apply_patch(weights, gpu_patch)
        assert state_hash(weights) == state_hash(new)
        print(
            f"  {name:15s} encode CPU {nbytes / cpu_s / 1e9:6.2f} GB/s   GPU {nbytes / gpu_s / 1e9:6.2f} GB/s "
            f"({cpu_s / gpu_s:5.1f}x)   {len(gpu_patch):,} B, identical to the CPU patch, applies",
            flush=True,
        )
    for codec in ("pulse", "pulse-ctx"):
        store = WeightStore(make_codec(codec), wire_dtype=torch.bfloat16, device="cuda", snapshot_every=1000)
        store.publish(0, gpu_base)
        store.publish(1, gpu_new)  # warm-up: allocates the spare copy
        store.publish(2, gpu_base)
        torch.cuda.synchronize()
        start = time.perf_counter()
        published = store.publish(3, gpu_new)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        print(
            f"  store.publish on cuda, {codec:9s}: {seconds * 1e3:7.1f} ms = {nbytes / seconds / 1e9:6.2f} GB/s "
            f"(patch {published.patch_nbytes:,} B)",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=float, default=1e8, help="size of the noise step")
    parser.add_argument("--steps", nargs="+", default=["noise", "qwen3"], choices=["noise", "qwen3", "synthetic"])
    parser.add_argument("--lr", type=float, default=1e-6)
    args = parser.parse_args()
    assert torch.cuda.is_available(), "no CUDA device"
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, {os.cpu_count()} CPUs")
    for kind in args.steps:
        base, new = step_pair(kind, int(args.params), args.lr)
        bench_step(f"{kind} step, lr {args.lr}", base, new)


if __name__ == "__main__":
    main()
