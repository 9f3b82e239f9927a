"""Codec speed, compiled kernels vs the numpy reference, in one table (heterorl/bench/codec.py says what is timed).

    .venv/bin/python benchmarks/codec_speed.py          # synthetic 70M + Qwen3 ~90M, 1 and 2 threads
    .venv/bin/python benchmarks/codec_speed.py --steps synthetic --threads 1 16 --no-reference

GB = bf16 model bytes (2 x parameters). "enc/dec GB/s": per second of process CPU time, best of --repeats;
the first line gives the machine's memory read speed at each thread count (what bounds the scan and the apply);
"wall": per wall second (what threads buy); "x": native / numpy per CPU-second. The Qwen3 step is built once
(4 AdamW steps of a ~90M Qwen3 on CPU, a few minutes) and cached under $HETERORL_CACHE/pulse-steps.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from heterorl.bench.codec import HEADER, codec_rows, memory_line, thread_speedups
from heterorl.weights import native


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", nargs="+", default=["synthetic", "qwen3"], choices=["synthetic", "qwen3", "noise"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-reference", action="store_true", help="skip the numpy reference columns")
    args = parser.parse_args()
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, kernels built: {native.BUILT} "
        f"({native.LEVEL} loops), "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(memory_line(args.threads), flush=True)
    print(HEADER + "\n" + "-" * len(HEADER), flush=True)
    rows = codec_rows(args.steps, args.threads, args.repeats, reference=not args.no_reference)
    for line in thread_speedups(rows):
        print(line)
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
