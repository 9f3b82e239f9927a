"""Supervised warm start: a short teacher-forced pass that yields a partly competent base model for RL.

RL post-training needs a policy that sometimes succeeds (otherwise every group has equal rewards and zero
advantage). Training stops as soon as greedy accuracy on a validation set drawn from the training stream
reaches `pretrain.target_accuracy`, which makes the base model's competence a setting rather than an accident.
The result is cached under a key of everything that determines it, so the demo builds it once: the config's
seed, model, task, pretrain settings and `runtime.threads`, which pretraining applies itself (float reductions
split by thread, so another thread count gives other weights). `pretrain.json` records the weights' state hash,
so two machines can check they hold the same base model; on one machine it does not depend on OMP_NUM_THREADS
or the caller's thread settings. Across machines it can still differ where torch's kernels do (another torch
build or CPU instruction set): compare the hashes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from heterorl.config import RunConfig
from heterorl.console import progress_bar
from heterorl.evaluate import greedy_accuracy
from heterorl.policy import Policy
from heterorl.tasks import Task, make_task
from heterorl.tokenizer import CHARACTERS
from heterorl.weights import state_hash

CACHE_FORMAT = 1


@dataclass
class PretrainResult:
    path: str
    steps: int
    val_accuracy: float
    cached: bool = False
    state_hash: str = ""  # of the saved fp32 weights: equal hashes, identical base models
    threads: int | None = None  # torch threads it was trained with


def cache_dir() -> Path:
    return Path(os.environ.get("HETERORL_CACHE", Path.home() / ".cache" / "heterorl"))


def pretrain_seed(cfg: RunConfig) -> int:
    """The warm start's seed: `pretrain.seed`, or the run's seed when that is None."""
    return cfg.seed if cfg.pretrain.seed is None else cfg.pretrain.seed


def base_model_key(cfg: RunConfig) -> str:
    """Hash of everything that determines the pretrained base model (the run's seed only through `pretrain_seed`,
    so a base built with `pretrain.seed: s` is the one a run with seed s and no `pretrain.seed` builds)."""
    payload = {
        "format": CACHE_FORMAT,
        "characters": CHARACTERS,
        "seed": pretrain_seed(cfg),
        "model": cfg.model.model_dump(exclude={"path", "device"}),
        "task": cfg.task.model_dump(exclude={"reward", "reward_weights"}),  # the warm start uses no reward
        "pretrain": cfg.pretrain.model_dump(exclude={"seed"}),
        "max_new_tokens": cfg.sampler.max_new_tokens,
        "threads": cfg.runtime.threads,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def supervised_loss(policy: Policy, prompts: list[str], answers: list[str]) -> torch.Tensor:
    """Mean negative log-likelihood of `answer + eos` given the prompt (completion tokens only)."""
    from heterorl.policy import SamplingParams

    prompt_ids, prompt_mask = policy.encode_prompts(prompts)
    tok = policy.tokenizer
    targets = [tok(a, add_special_tokens=False)["input_ids"] + [policy.eos_id] for a in answers]
    L = max(len(t) for t in targets)
    ids = torch.full((len(targets), L), policy.pad_id, dtype=torch.long)
    mask = torch.zeros((len(targets), L), dtype=torch.long)
    for i, t in enumerate(targets):
        ids[i, : len(t)] = torch.tensor(t)
        mask[i, : len(t)] = 1
    ids, mask = ids.to(policy.device), mask.to(policy.device)
    logp = policy.token_logprobs(prompt_ids, prompt_mask, ids, mask, SamplingParams())
    return -(logp.sum() / mask.sum())


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run a block with `threads` torch threads (None: as they are), restoring the caller's count after."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def pretrain(cfg: RunConfig, out_dir: str | Path, show_progress: bool = True) -> PretrainResult:
    """Train from scratch until validation greedy accuracy reaches the target (or max_steps); save to out_dir.
    Runs with `runtime.threads` torch threads whoever calls it (the weights depend on the thread count)."""
    if cfg.model.path is not None:
        raise ValueError("pretrain builds a model from model.arch; unset model.path")
    with torch_threads(cfg.runtime.threads):
        return _pretrain(cfg, Path(out_dir), show_progress)


def _pretrain(cfg: RunConfig, out: Path, show_progress: bool) -> PretrainResult:
    pc = cfg.pretrain
    task: Task = make_task(cfg.task, rewards=False)
    seed = pretrain_seed(cfg)
    policy = Policy.from_config(cfg.model, seed=seed)
    stream = task.train_stream(seed + 17)
    val = [next(stream) for _ in range(pc.eval_size)]
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=pc.lr, weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, pc.warmup_steps)))
    accuracy, step = 0.0, 0
    with progress_bar("pretrain", total=pc.max_steps, enabled=show_progress) as bar:
        for step in range(1, pc.max_steps + 1):
            batch = [next(stream) for _ in range(pc.batch_size)]
            policy.model.train()
            loss = supervised_loss(policy, [p.prompt for p in batch], [p.answer for p in batch])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
            optimizer.step()
            warmup.step()
            bar.advance(1, loss=loss.detach().item())
            if step % pc.eval_every == 0:
                accuracy = greedy_accuracy(policy, task, val, cfg.sampler.max_new_tokens)
                bar.advance(0, acc=accuracy)
                if accuracy >= pc.target_accuracy:
                    break
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    policy.save(tmp)
    weights = dict(policy.model.named_parameters())
    result = PretrainResult(str(out), step, accuracy, state_hash=state_hash(weights), threads=torch.get_num_threads())
    (tmp / "pretrain.json").write_text(json.dumps(asdict(result), indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)  # atomic publication of a complete checkpoint
    return result


def ensure_base_model(cfg: RunConfig, show_progress: bool = True) -> PretrainResult:
    """The cached base model for this config, pretraining it first if it is not cached yet.

    A file lock per model makes parallel callers (sweep workers) wait for one pretraining instead of racing.
    """
    import fcntl

    out = cache_dir() / "base" / base_model_key(cfg)
    marker = out / "pretrain.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / f"{out.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if marker.is_file():
            data = json.loads(marker.read_text())
            return PretrainResult(**{**data, "path": str(out), "cached": True})
        return pretrain(cfg, out, show_progress=show_progress)
