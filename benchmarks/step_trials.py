"""One timed trial of an RL loop, run in a fresh process by `step_throughput.py`: heterorl's simulated cluster, or
TRL's GRPOTrainer on the same work. Prints one JSON line: seconds per RL step and their split into phases.

A step is the interval between two consecutive step ends of the loop (heterorl: `LearnerLoop.commit`; TRL: the
trainer's `on_step_begin` callbacks), so everything the loop does per step counts (logging, data, bookkeeping);
the first `--warmup` steps are left out. Held-out evaluation (heterorl's `eval.every`) is timed apart and left out.
Seconds are wall (perf_counter), process CPU (every thread: heterorl's background publish counts) and main-thread
CPU, summed per phase over the measured steps and divided by their number (an async loop does not generate in
step with the learner, so per-step means are the meaningful split).

    python benchmarks/step_trials.py heterorl --steps 30 --set cluster.mode=sync
    PYTHONPATH=<trl site> python benchmarks/step_trials.py trl --steps 30
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import torch

from heterorl.config import RunConfig, load_config

REPO = Path(__file__).resolve().parents[1]
CLOCKS = ("wall", "cpu", "thread")


def _now() -> tuple[float, float, float]:
    return time.perf_counter(), time.process_time(), time.thread_time()


class PhaseTimer:
    """Seconds per phase on the main thread, exclusive: a timed call inside another is charged to its own phase
    only (the publish a learner step waits for is `sync`, not `train`)."""

    def __init__(self) -> None:
        self.totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        self._stack: list[tuple[str, tuple[float, float, float], list[float]]] = []

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        """Charge every call of `owner.name` (a method or function attribute) to `phase`."""
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            return self.call(phase, fn, *args, **kwargs)

        setattr(owner, name, timed)

    def call(self, phase: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        inner = [0.0, 0.0, 0.0]
        start = _now()
        self._stack.append((phase, start, inner))
        try:
            return fn(*args, **kwargs)
        finally:
            self._stack.pop()
            spent = [b - a for a, b in zip(start, _now(), strict=True)]
            total = self.totals[phase]
            for i in range(3):
                total[i] += spent[i] - inner[i]
            if self._stack:
                for i in range(3):
                    self._stack[-1][2][i] += spent[i]

    def generator(self, phase: str, process: Generator[Any, None, Any]) -> Generator[Any, None, Any]:
        """`process` with the time of each of its steps charged to `phase`."""
        while True:
            try:
                value = self.call(phase, next, process)
            except StopIteration as end:
                return end.value
            yield value

    def snapshot(self) -> dict[str, list[float]]:
        return {k: list(v) for k, v in self.totals.items()}


class StepLog:
    """Step boundaries (all three clocks) and the phase totals at each one."""

    def __init__(self, timer: PhaseTimer) -> None:
        self.timer = timer
        self.marks: list[tuple[tuple[float, float, float], dict[str, list[float]]]] = []

    def mark(self) -> None:
        self.marks.append((_now(), self.timer.snapshot()))

    def result(self, warmup: int, phases: tuple[str, ...], excluded: tuple[str, ...] = ()) -> dict[str, Any]:
        """Per-step means over the steps after `warmup`: total, each phase, `other` = total - phases - excluded."""
        (t0, p0), (t1, p1) = self.marks[warmup], self.marks[-1]
        n = len(self.marks) - 1 - warmup
        assert n > 0, f"{len(self.marks) - 1} steps timed, {warmup} of them warm-up"

        def spent(phase: str) -> list[float]:
            return [(p1.get(phase, [0.0] * 3)[i] - p0.get(phase, [0.0] * 3)[i]) / n for i in range(3)]

        out: dict[str, Any] = {"steps": n}
        for i, clock in enumerate(CLOCKS):
            total = (t1[i] - t0[i]) / n - sum(spent(p)[i] for p in excluded)
            split = {p: spent(p)[i] for p in phases}
            split["other"] = total - sum(split.values())
            out[clock] = {"total": total, **split, **{f"{p} (excluded)": spent(p)[i] for p in excluded}}
        return out


# ---------------------------------------------------------------------------------------------------- heterorl
def heterorl_trial(cfg: RunConfig, warmup: int) -> dict[str, Any]:
    """The simulated cluster of `cfg`, timed by phase: generate (sampling and scoring, in the sampler worker),
    train (`LearnerLoop.train`), sync (export + publish hand-off and waits, sends, settling, receiving, loading
    into the engine), verify (the rollout verifier re-scoring the groups it picks: trust work TRL has no part
    of), eval (excluded), other (intake's other checks, records, the event loop)."""
    from heterorl.loop.learner_loop import LearnerLoop
    from heterorl.loop.publisher import BackgroundPublisher
    from heterorl.loop.verifier import RolloutVerifier
    from heterorl.loop.worker import SamplerWorker
    from heterorl.run.build import configure_torch, resolve_base_model
    from heterorl.run.recorder import RunRecorder
    from heterorl.simulated.run import build_simulated
    from heterorl.transport.simulated.link import SimLearnerSide

    timer = PhaseTimer()
    steps = StepLog(timer)
    generate = SamplerWorker.generate
    SamplerWorker.generate = lambda self, n, load=True: timer.generator("generate", generate(self, n, load))  # type: ignore[method-assign]
    timer.wrap(LearnerLoop, "train", "train")
    for owner, name in [
        (LearnerLoop, "publish"),
        (BackgroundPublisher, "result"),
        (SimLearnerSide, "settle"),
        (SimLearnerSide, "_answer"),
        (SamplerWorker, "receive"),
        (SamplerWorker, "refresh"),
    ]:
        timer.wrap(owner, name, "sync")
    timer.wrap(RolloutVerifier, "check", "verify")
    timer.wrap(RunRecorder, "evaluate", "eval")
    commit = LearnerLoop.commit

    def timed_commit(self: LearnerLoop, *args: Any, **kwargs: Any) -> Any:
        record = commit(self, *args, **kwargs)
        steps.mark()
        return record

    LearnerLoop.commit = timed_commit  # type: ignore[method-assign]
    configure_torch(cfg)
    base, _ = resolve_base_model(cfg, show_progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        cluster = build_simulated(cfg, Path(tmp), base)
        steps.mark()  # after the initial evaluation (start() runs in run(), charged to eval)
        cluster.run()
        cluster.loop.publisher.close()
        cluster.close()
        rewards = cluster.loop.recorder.rewards
    out = steps.result(warmup, ("generate", "train", "sync", "verify"), excluded=("eval",))
    out["reward"] = sum(rewards[warmup:]) / max(len(rewards[warmup:]), 1)
    return out


# ---------------------------------------------------------------------------------------------------- TRL
def trl_trial(cfg: RunConfig, warmup: int) -> dict[str, Any]:
    """TRL's GRPOTrainer on `cfg`'s work: its base model (fp32), the prompts heterorl's sampler 0 draws, in order
    (`shuffle_dataset=False`), the task's verifier as the reward, G and prompts per step, GRPO's loss with group
    std scaling, AdamW and clipping as the learner's. Phases: generate (`_generate_and_score_completions`:
    generation, decoding, rewards, advantages), train (the rest of `training_step` through the optimizer step),
    other (data loading, logging, callbacks)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from heterorl.run.build import configure_torch, resolve_base_model, sampler_seed
    from heterorl.tasks import Problem, make_task

    configure_torch(cfg)
    base, _ = resolve_base_model(cfg, show_progress=False)
    task = make_task(cfg.task)
    stream = task.train_stream(sampler_seed(cfg.seed, 0))
    B, G, L = cfg.learner.groups_per_step, cfg.sampler.group_size, cfg.learner
    problems = [next(stream) for _ in range(B * L.steps)]
    data = Dataset.from_dict({"prompt": [p.prompt for p in problems], "answer": [p.answer for p in problems]})

    def reward(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
        return [task.score(Problem(p, a), c) for p, c, a in zip(prompts, completions, answer, strict=True)]

    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    timer = PhaseTimer()
    steps = StepLog(timer)
    began: list[tuple[float, float, float]] = []

    class Marks(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            steps.mark()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:  # train = training_step start .. here
            spent = [b - a for a, b in zip(began.pop(), _now(), strict=True)]
            generate = timer.totals["generate"]
            total = timer.totals["train"]
            for i in range(3):
                total[i] += spent[i] - (generate[i] - began_generate[i])

    began_generate = [0.0, 0.0, 0.0]
    timer.wrap(GRPOTrainer, "_generate_and_score_completions", "generate")
    training_step = GRPOTrainer.training_step

    def timed_training_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not began:
            began.append(_now())
            began_generate[:] = timer.totals["generate"]
        return training_step(self, *args, **kwargs)

    GRPOTrainer.training_step = timed_training_step  # type: ignore[method-assign]
    output_dir = tempfile.mkdtemp(prefix="trl-bench-")  # TRL's checkpoints would go there (save_strategy "no")
    args = GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=B * G,
        num_generations=G,
        max_completion_length=cfg.sampler.max_new_tokens,
        temperature=cfg.sampler.temperature,
        top_p=cfg.sampler.top_p,
        top_k=cfg.sampler.top_k,
        learning_rate=L.lr,
        lr_scheduler_type="constant",
        adam_beta1=L.beta1,
        adam_beta2=L.beta2,
        adam_epsilon=L.adam_eps,
        weight_decay=L.weight_decay,
        max_grad_norm=L.grad_clip,
        beta=0.0,  # no reference model (heterorl's ref_kl_beta 0)
        num_iterations=1,  # one optimizer step per generation: on-policy, no old log-prob pass
        loss_type="grpo",  # per-sequence token mean, then mean over sequences (heterorl's seq_mean_token_mean)
        scale_rewards="group",  # (r - group mean) / group std (heterorl's normalize_advantages)
        epsilon=0.2,
        max_steps=L.steps,
        shuffle_dataset=False,
        gradient_checkpointing=False,  # TRL's default is True; heterorl's learner does not recompute
        bf16=False,  # fp32, as heterorl's learner
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=cfg.seed,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tokenizer, callbacks=[Marks()]
    )
    try:
        trainer.train()
        steps.mark()  # the end of the last step
    finally:
        shutil.rmtree(output_dir, ignore_errors=True)
    out = steps.result(warmup, ("generate", "train"))
    logged = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    out["reward"] = sum(logged) / max(len(logged), 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("framework", choices=["heterorl", "trl"])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "demo.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="dotted.key=value")
    parser.add_argument("--steps", type=int, default=30, help="measured steps")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out first")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(args.config, [*args.overrides, f"learner.steps={args.warmup + args.steps}"])
    trial = heterorl_trial if args.framework == "heterorl" else trl_trial
    print(json.dumps(trial(cfg, args.warmup)))


if __name__ == "__main__":
    main()
