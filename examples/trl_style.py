"""Post-train the way TRL's GRPOTrainer is used: a config dict, reward functions as Python callables (TRL's
batched signature, weighted), and an in-memory `datasets.Dataset` with `prompt` and `answer` columns.

python examples/trl_style.py                          # 40 steps on the simulated cluster (a warm start first)
python examples/trl_style.py --steps 5 --model DIR    # a transformers checkpoint instead of the warm start

The reward functions are defined in this script, which the simulated cluster runs in this one process. For
`fit(clock="live")` (samplers in other processes) they must live in a module the samplers can import, e.g. a
`my_rewards.py` in the directory you run from: a function of the script itself is refused with one line saying so.
docs/api.md has the table of TRL's arguments and heterorl's keys.
"""

from __future__ import annotations

import argparse
import random

from datasets import Dataset

from heterorl import Trainer


def correct(prompts: list[str], completions: list[str], answer: list[str], **kwargs: object) -> list[float]:
    """1 for the right sum (TRL's signature: a batch of completions, the dataset's columns as keywords)."""
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer, strict=True)]


def concise(completions: list[str], **kwargs: object) -> list[float]:
    """-0.1 per character beyond the two a sum of two digits needs."""
    return [-0.1 * max(0, len(c.strip()) - 2) for c in completions]


def sums(pairs: list[tuple[int, int]]) -> Dataset:
    return Dataset.from_dict({"prompt": [f"{a}+{b}=" for a, b in pairs], "answer": [str(a + b) for a, b in pairs]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--model", default=None, help="a transformers checkpoint directory (default: warm start)")
    parser.add_argument("--run-dir", default=None)
    args = parser.parse_args()
    pairs = [(a, b) for a in range(10) for b in range(10)]
    random.Random(0).shuffle(pairs)
    config = {
        "task": {"eval_size": 20},
        "sampler": {"group_size": 8, "max_new_tokens": 4, "temperature": 1.0},
        "learner": {"steps": args.steps, "groups_per_step": 8, "lr": 3e-4},
        "eval": {"every": 10},
        "pretrain": {"target_accuracy": 0.3, "max_steps": 600},
    }
    if args.model:
        config["model"] = {"path": args.model}
    trainer = Trainer(
        config,
        reward_funcs=[correct, concise],
        reward_weights=[1.0, 0.5],
        train_dataset=sums(pairs[20:]),
        eval_dataset=sums(pairs[:20]),
        run_dir=args.run_dir,
        show_progress=False,
    )
    summary = trainer.fit()
    print(
        f"{summary['steps']} steps, reward {summary['reward_first']:.3f} -> {summary['reward_last']:.3f}, held-out "
        f"accuracy {summary['accuracy_initial']:.1%} -> {summary['accuracy_final']:.1%}, run {trainer.run_dir}"
    )


if __name__ == "__main__":
    main()
