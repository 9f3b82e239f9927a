"""Post-train from Python: a run built in code, watched by callbacks, stopped early when a target is reached.

python examples/train_from_python.py                       # the smoke config on the simulated cluster
python examples/train_from_python.py --live --steps 20     # the same loop on local processes over HTTP
"""

from __future__ import annotations

import argparse
from typing import Any

from heterorl import Callback, Trainer


class PrintRewards(Callback):
    """Prints the reward and staleness of every tenth learner step."""

    def on_step(self, trainer: Trainer, record: dict[str, Any]) -> None:
        if record["step"] % 10 == 0:
            print(f"step {record['step']:4d}  reward {record['reward/mean']:.3f}  staleness {record['stale/mean']:.1f}")


class StopAtAccuracy(Callback):
    """Ends the run (final evaluation, checkpoint, summary) once held-out accuracy reaches `target`."""

    def __init__(self, target: float) -> None:
        self.target = target

    def on_evaluate(self, trainer: Trainer, record: dict[str, Any]) -> None:
        print(f"step {record['step']:4d}  held-out accuracy {record['eval/accuracy']:.1%}")
        if record["step"] > 0 and record["eval/accuracy"] >= self.target:
            trainer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="configs/smoke.yaml")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--target", type=float, default=0.5, help="stop at this held-out accuracy")
    parser.add_argument("--run-dir", default=None)
    parser.add_argument("--live", action="store_true", help="run the learner and samplers as local processes")
    args = parser.parse_args()
    trainer = Trainer(
        args.config,
        overrides=[f"learner.steps={args.steps}", "eval.every=5"],
        run_dir=args.run_dir,
        callbacks=[PrintRewards(), StopAtAccuracy(args.target)],
        show_progress=False,
    )
    summary = trainer.fit(clock="live" if args.live else "simulated")
    print(
        f"{summary['steps']} steps, accuracy {summary['accuracy_initial']:.1%} -> {summary['accuracy_final']:.1%}, "
        f"run directory {trainer.run_dir}"
    )


if __name__ == "__main__":
    main()
