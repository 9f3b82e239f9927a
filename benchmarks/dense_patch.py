"""A dense step in PULSE's dense layout against the same step in the sparse one (docs/weight-sync.md, "Dense tensors").

    .venv/bin/python benchmarks/dense_patch.py                 # 157M bf16 elements, 100% / 80% / 60% of them moved
    .venv/bin/python benchmarks/dense_patch.py --rates 0.5 --scale 0.25

The model: a 32,000 x 768 embedding and 14 layers of 4 768 x 768 and 3 3072 x 768 matrices (--scale multiplies
the layer count), weights N(0, 0.02), a step moving `rate` of them by 0.5-1 x 1e-4 with a random sign (about
what an AdamW step at lr 1e-4 does; a moved weight does not always change its bf16 bits). Each trial encodes the
patch as the learner does (the base's hash known) with the dense layout allowed and with it switched off, in
turns, and applies it; CPU seconds of this process (one torch thread), best and worst of --repeats.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch

from heterorl.weights import apply_patch, dense
from heterorl.weights.hashing import state_hash
from heterorl.weights.patch import encode_versions


def model(rate: float, scale: float, seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    layers = max(1, round(14 * scale))
    shapes = [(32000, 768)] + [(768, 768)] * 4 * layers + [(3072, 768)] * 3 * layers
    base, new = {}, {}
    for i, shape in enumerate(shapes):
        w = torch.randn(shape, generator=gen) * 0.02
        moved = torch.rand(shape, generator=gen) < rate
        step = 1e-4 * torch.randn(shape, generator=gen).sign() * (0.5 + 0.5 * torch.rand(shape, generator=gen))
        base[f"t{i:03d}"], new[f"t{i:03d}"] = w.bfloat16(), (w + step * moved).bfloat16()
    return base, new


def cpu(fn):  # type: ignore[no-untyped-def]
    began = time.process_time()
    out = fn()
    return time.process_time() - began, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", nargs="+", type=float, default=[1.0, 0.8, 0.6])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    print("changed  layout   encode CPU-s   MB      apply CPU-s")
    share = dense.DENSE_SHARE
    for rate in args.rates:
        base, new = model(rate, args.scale)
        numel = sum(t.numel() for t in base.values())
        known = state_hash(base)
        rows: dict[str, list[tuple[float, float, int, float]]] = {"dense": [], "sparse": []}
        for _ in range(args.repeats):
            for layout in rows:
                dense.DENSE_SHARE = share if layout == "dense" else 2.0  # a share above 1: never dense
                try:
                    seconds, out = cpu(partial(encode_versions, base, new, formats=(1,), hashes=(known, None)))
                finally:
                    dense.DENSE_SHARE = share
                weights = {k: v.clone() for k, v in base.items()}
                applied, _ = cpu(partial(apply_patch, weights, out.v1))
                rows[layout].append((seconds, out.changed / numel, len(out.v1), applied))
        for layout, trials in rows.items():
            enc, app = sorted(t[0] for t in trials), sorted(t[3] for t in trials)
            print(
                f"{trials[0][1]:6.1%}   {layout:8} {enc[0]:5.2f}-{enc[-1]:<5.2f}    {trials[0][2] / 1e6:6.1f}  "
                f"{app[0]:5.2f}-{app[-1]:.2f}"
            )
        best = {layout: min(t[0] for t in trials) for layout, trials in rows.items()}
        size = rows["dense"][0][2] / rows["sparse"][0][2]
        print(f"         dense / sparse: encode CPU x{best['dense'] / best['sparse']:.2f}, bytes x{size:.3f}")
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
