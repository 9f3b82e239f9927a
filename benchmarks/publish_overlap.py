"""ParaBlock's communication–computation overlap: learner step time with publishing inline vs in the background.

Each learner step is followed by publishing its weights (bf16 cast, PULSE diff + encode, hashes, store). Inline,
the next step waits for it; with `weights.overlap` the publish runs in a worker thread while the next step
computes. Both variants run here on the same model and the same batches, and the mean wall time per
step (train + publish, as seen by the training loop) is printed with the ratio.

    .venv/bin/python benchmarks/publish_overlap.py --hidden 512 --layers 8 --steps 12
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from heterorl.config import ModelConfig, load_config
from heterorl.learner import Learner
from heterorl.loop.publisher import BackgroundPublisher
from heterorl.policy import Policy
from heterorl.sampler import Sampler
from heterorl.tasks import make_task


def run(overlap: bool, args: argparse.Namespace) -> tuple[list[float], float, list[float]]:
    model_cfg = ModelConfig(
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=8,
        num_kv_heads=2,
        intermediate_size=args.hidden * 3,
        max_positions=64,
    )
    cfg = load_config(None, [f"weights.overlap={str(overlap).lower()}", "learner.groups_per_step=8", "learner.lr=1e-5"])
    learner = Learner(Policy.from_config(model_cfg, seed=0), cfg)
    sampler = Sampler.from_policy(
        "s", Policy.from_config(model_cfg, seed=0), make_task(cfg.task), learner.params, 8, seed=0
    )
    sampler.load_weights(0, learner.export_weights())
    batches = [sampler.generate_groups(8) for _ in range(args.steps + 1)]
    publisher = BackgroundPublisher(cfg.weights)
    publisher.submit(0, learner.export_weights())
    publisher.result()
    times, publish = [], []
    for groups in batches:
        start = time.perf_counter()
        learner.train_step(groups)
        publisher.submit(learner.version, learner.export_weights())  # waits for the previous publish if pending
        times.append(time.perf_counter() - start)
        if not overlap:
            publish.append(publisher.result().seconds)
    publisher.close()
    params = sum(p.numel() for p in learner.policy.model.parameters())
    return times[1:], params, publish[1:]  # the first step pays for warm-up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    torch.manual_seed(0)
    inline, params, publish = run(False, args)
    overlapped, _, _ = run(True, args)
    a, b = statistics.mean(inline), statistics.mean(overlapped)
    print(f"model: {params / 1e6:.1f}M parameters, {args.steps} steps each, {torch.get_num_threads()} threads")
    print(f"publish inline     : {a * 1000:8.1f} ms per step (median {statistics.median(inline) * 1000:.1f})")
    print(f"publish overlapped : {b * 1000:8.1f} ms per step (median {statistics.median(overlapped) * 1000:.1f})")
    print(f"publish alone      : {statistics.mean(publish) * 1000:8.1f} ms (cast, diff, encode, hash, store)")
    print(f"overlap speed-up   : {a / b:.2f}x")


if __name__ == "__main__":
    main()
