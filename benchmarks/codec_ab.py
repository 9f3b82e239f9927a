"""Two builds of the codec kernels against each other, interleaved in one process (same Python code, same step).

    .venv/bin/python benchmarks/codec_ab.py OLD.so NEW.so --threads 1 2 --rounds 5
    .venv/bin/python benchmarks/codec_ab.py OLD.so NEW.so --step qwen3

Build the old kernels from an export of another commit (`git archive <commit> setup.py pyproject.toml
src/heterorl/weights/native | tar -x -C DIR`, then `python setup.py build_ext --inplace` in DIR). Every round
encodes, reverts and applies the patch once per build, the builds in turn (in reverse order every other round), so
they see the same load; figures are the best of `--rounds`, in GB of bf16 model bytes per CPU-second (and per wall
second), and "x" is the median over rounds of the first build's CPU time over this one's in the same round (on a
VM whose speed drifts between minutes, the best-of figures of two builds can come from different phases; the
per-round ratio cannot). The builds must write the same bytes (checked).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from heterorl.bench.steps import step_pair
from heterorl.weights import native
from heterorl.weights.patch import apply_patch, encode_patch


def load(path: str):  # type: ignore[no-untyped-def]
    """A compiled `_pulse` module from a file (any build of pulse.c)."""
    spec = importlib.util.spec_from_file_location("heterorl.weights.native._pulse", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("builds", nargs="+", help="paths of compiled _pulse modules")
    parser.add_argument("--step", default="synthetic", choices=["synthetic", "qwen3", "noise"])
    parser.add_argument("--params", type=float, default=7e7)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    args = parser.parse_args()
    torch.set_num_threads(1)
    builds = {path: load(path) for path in args.builds}
    base, new = step_pair(args.step, int(args.params), 1e-6)
    gb = 2 * sum(t.numel() for t in base.values()) / 1e9
    print(f"{args.step}, {gb / 2 * 1e3:.0f}M parameters, load average {os.getloadavg()[0]:.2f}", flush=True)
    for context in (False, True):
        for threads in args.threads:
            best = {path: [float("inf")] * 4 for path in builds}
            cpu = {path: ([], []) for path in builds}  # per round: encode, decode CPU seconds
            weights = {k: v.clone() for k, v in base.items()}
            patches = []
            for module in builds.values():
                native._pulse = module
                patches.append(encode_patch(base, new, context=context, workers=threads))
            if any(p != patches[0] for p in patches):
                raise AssertionError("the builds wrote different bytes")
            back = encode_patch(new, base, context=context, workers=threads)
            apply_patch(weights, patches[0], workers=threads)
            for r in range(args.rounds):
                for path, module in list(builds.items())[:: 1 if r % 2 == 0 else -1]:
                    native._pulse = module
                    b = best[path]
                    c, w = time.process_time(), time.perf_counter()
                    encode_patch(base, new, context=context, workers=threads)
                    b[0], b[2] = min(b[0], time.process_time() - c), min(b[2], time.perf_counter() - w)
                    cpu[path][0].append(time.process_time() - c)
                    apply_patch(weights, back, workers=threads)
                    c, w = time.process_time(), time.perf_counter()
                    apply_patch(weights, patches[0], workers=threads)
                    b[1], b[3] = min(b[1], time.process_time() - c), min(b[3], time.perf_counter() - w)
                    cpu[path][1].append(time.process_time() - c)
            first = cpu[args.builds[0]]
            for path, b in best.items():
                x_enc, x_dec = (
                    statistics.median(f / t for f, t in zip(first[i], cpu[path][i], strict=True)) for i in (0, 1)
                )
                print(
                    f"v{2 if context else 1} threads {threads} {path}: enc {gb / b[0]:.2f} dec {gb / b[1]:.2f} "
                    f"GB/CPU-s, wall enc {gb / b[2]:.2f} dec {gb / b[3]:.2f} GB/s, x enc {x_enc:.2f} dec {x_dec:.2f}",
                    flush=True,
                )
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
