"""The multi-process learner on a GPU: equality with one process (NCCL), learner and engine throughput.

Run as one torchrun rank on one GPU (a single GPU cannot host two NCCL ranks):

    torchrun --nproc-per-node 1 benchmarks/distributed_gpu.py --size qwen3-0.6b

For each strategy (fsdp2, ddp) it trains K steps of a random Qwen3 model on the same synthetic groups (micro-batching
on) as one process and as rank 0 of an NCCL group, and prints the maximum absolute difference of the parameters.
World size 1 exercises every CUDA/NCCL code path of the sharded learner (device mesh, DTensor parameters and AdamW
moments, gradient-sync control, the gather into rank 0's full copy and of the optimizer state); that gradients
summed over several ranks equal one process's is what the 2-rank gloo test on CPU shows with the same code.
Then it prints trained tokens/s of the learner (one process, fp32 master + bf16 autocast) and generated tokens/s of
the transformers rollout engine (bf16) on the same model. `--size tiny` runs the same on a small model (CPU too).

Measured 2026-11-23 on one H100 80GB (torch 2.11.0+cu130, transformers 5.17), defaults (8 groups x 8 completions
of 128-256 tokens after 64 prompt tokens a step, micro-batches of 4096 tokens, 2 optimizer steps a batch, lr 1e-5):
after 2 steps the parameters moved up to 4.0e-5; FSDP2 as one NCCL rank differs from one process by at most
5.7e-7 and DDP by 9.4e-7, while one process run twice differs from itself by 6.7e-7 (CUDA kernels such as the
embedding backward are not bit-deterministic), so the sharded paths add nothing measurable. Learner, fp32 master:
7.2k trained tokens/s in one process, 6.1k as one FSDP2 rank (the gather into rank 0's full copy every step),
7.4k as one DDP rank; with bf16 autocast 14.5k (5.9k in an earlier run on a cold machine: treat one run as noisy).
Transformers engine, bf16, 256 sequences x 256 new tokens (no early stop on a random model): 3.7k tokens/s.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from heterorl.config import load_config
from heterorl.engines.transformers_engine import TransformersEngine
from heterorl.learner import Learner
from heterorl.parallel import distributed
from heterorl.policy import Policy, SamplingParams, run_process
from heterorl.rollout import RolloutGroup
from heterorl.tokenizer import build_char_tokenizer

SIZES = {  # Qwen3-0.6B's shape (hub config), and a small one for CPU checks
    "qwen3-0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512},
}  # fmt: skip


def make_policy(size: str, device: torch.device, dtype: torch.dtype = torch.float32) -> Policy:
    tokenizer = build_char_tokenizer()
    shape = SIZES[size]
    config = Qwen3Config(
        **shape,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    return Policy(AutoModelForCausalLM.from_config(config, dtype=dtype), tokenizer, device)


def synthetic_groups(n: int, group_size: int, prompt_len: int, max_len: int, vocab: int, seed: int) -> list:
    """Groups of random tokens with unequal lengths and 0/1 rewards (behaviour log-probs: `score_groups`)."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for i in range(n):
        lengths = torch.randint(max_len // 2, max_len + 1, (group_size,), generator=g)
        L = int(lengths.max())
        mask = (torch.arange(L)[None] < lengths[:, None]).long()
        ids = torch.randint(3, vocab, (group_size, L), generator=g) * mask
        logp = torch.zeros(group_size, L)
        rewards = torch.randint(0, 2, (group_size,), generator=g).float()
        rewards[0], rewards[1] = 0.0, 1.0  # every group carries a signal
        groups.append(
            RolloutGroup(
                f"g{i}", "bench", "", "", torch.randint(3, vocab, (prompt_len,), generator=g), ids, mask, logp,
                torch.zeros_like(ids), rewards,
            )
        )  # fmt: skip
    return groups


@torch.no_grad()
def score_groups(policy: Policy, groups: list[RolloutGroup]) -> None:
    """Behaviour log-probs: the model's own, 0.02 nats per token off (a slightly stale sampler), so the ratios sit
    inside the clip range and every token carries a gradient."""
    params = SamplingParams()
    for group in groups:
        G = group.size
        prompt = group.prompt_ids_P[None].expand(G, -1).to(policy.device)
        logp = policy.token_logprobs(
            prompt, torch.ones_like(prompt), group.completion_ids_GL.to(policy.device),
            group.completion_mask_GL.to(policy.device), params,
        ).float().cpu()  # fmt: skip
        group.behavior_logp_GL = (logp - 0.02) * group.completion_mask_GL


def learner_cfg(args: argparse.Namespace, strategy: str, extra: list[str]):
    return load_config(
        None,
        [
            f"model.device={args.device}",
            f"sampler.group_size={args.group_size}",
            f"sampler.max_new_tokens={args.completion_len}",
            f"learner.groups_per_step={args.groups}",
            f"learner.micro_batch_tokens={args.micro_batch_tokens}",
            "learner.updates_per_batch=2",
            "learner.lr=1e-5",
            f"objective.name={args.objective}",
            f"parallel.strategy={strategy}",
            *extra,
        ],
    )


def train(learner: Learner, batches: list) -> tuple[float, int]:
    """Seconds and trained tokens (prompt + completion) of one train_step per batch."""
    tokens = sum(int(g.prompt_ids_P.numel()) * g.size + g.num_tokens for b in batches for g in b)
    sync = torch.cuda.synchronize if learner.policy.device.type == "cuda" else (lambda: None)
    sync()
    began = time.perf_counter()
    for batch in batches:
        learner.train_step(batch)
    sync()
    return time.perf_counter() - began, tokens


def params_of(learner: Learner) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().clone() for k, v in learner.policy.model.named_parameters()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=sorted(SIZES), default="qwen3-0.6b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--objective", default="grpo")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--completion-len", type=int, default=256)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--gen-prompts", type=int, default=32)
    args = parser.parse_args()
    device = torch.device(args.device)
    vocab = SIZES[args.size]["vocab_size"]
    batches = [
        synthetic_groups(args.groups, args.group_size, args.prompt_len, args.completion_len, vocab, seed=s)
        for s in range(args.steps)
    ]
    results: dict[str, object] = {"size": args.size, "device": torch.cuda.get_device_name() if args.device == "cuda"
                                  else "cpu", "torch": torch.__version__}  # fmt: skip

    single = Learner(make_policy(args.size, device), learner_cfg(args, "none", []))
    for batch in batches:
        score_groups(single.policy, batch)
    initial = params_of(single)
    single_s, tokens = train(single, batches)
    reference = params_of(single)
    moved = max(float((reference[k] - initial[k]).abs().max()) for k in reference)
    del single, initial
    results["equality_steps"], results["params_moved_max"] = args.steps, moved
    # the floor: one process run twice (GPU kernels such as the embedding backward are not bit-deterministic)
    again = Learner(make_policy(args.size, device), learner_cfg(args, "none", []))
    train(again, batches)
    results["single_repeat_max_abs_diff"] = max(
        float((reference[k] - v).abs().max()) for k, v in params_of(again).items()
    )
    del again

    ranks = distributed.start(learner_cfg(args, "fsdp2", []))
    if ranks is None or ranks.world != 1:
        raise SystemExit("run me as one torchrun rank: torchrun --nproc-per-node 1 benchmarks/distributed_gpu.py")
    results["backend"] = torch.distributed.get_backend()
    for strategy in ("fsdp2", "ddp"):
        ranks.cfg = learner_cfg(args, strategy, [])
        learner = Learner(make_policy(args.size, device), ranks.cfg)
        distributed.attach(learner)
        seconds, _ = train(learner, batches)
        got = params_of(learner)
        results[f"{strategy}_max_abs_diff"] = max(float((reference[k] - got[k]).abs().max()) for k in reference)
        results[f"{strategy}_train_tokens_per_s"] = tokens / seconds
        del learner
        if device.type == "cuda":
            torch.cuda.empty_cache()
    ranks.close()
    results["single_train_tokens_per_s"] = tokens / single_s
    print(json.dumps(results, indent=1), flush=True)

    # throughput: the learner with bf16 autocast (one process), then the transformers engine in bf16
    fast = Learner(make_policy(args.size, device), learner_cfg(args, "none", ["learner.autocast_bf16=true"]))
    train(fast, batches[:1])  # warm-up
    seconds, tokens = train(fast, batches)
    results["learner_bf16_autocast_train_tokens_per_s"] = tokens / seconds
    del fast
    sampler_policy = make_policy(args.size, device, torch.bfloat16)
    sampler_policy.model.requires_grad_(False)  # its weights are the random ones: nothing to load
    engine = TransformersEngine(sampler_policy, seed=0)
    engine.load_weights(0, {})
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(3, vocab, (args.gen_prompts, args.prompt_len), generator=g).to(device)
    mask = torch.ones_like(prompts)
    params = SamplingParams(max_new_tokens=args.completion_len)
    run_process(engine.generate(prompts[:2], mask[:2], 2, SamplingParams(max_new_tokens=8)))  # warm-up
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    began = time.perf_counter()
    gen = run_process(engine.generate(prompts, mask, args.group_size, params))
    sync()
    seconds = time.perf_counter() - began
    results["engine_sequences"] = int(gen.completion_ids_NL.shape[0])
    results["engine_new_tokens"] = int(gen.completion_mask_NL.sum())
    results["engine_tokens_per_s"] = results["engine_new_tokens"] / seconds
    print(json.dumps(results, indent=1), flush=True)


if __name__ == "__main__":
    main()
