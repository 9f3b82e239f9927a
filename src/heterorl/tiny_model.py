"""A tiny Qwen3 with a byte-level BPE tokenizer and a chat template, built offline from a problems file.

For trying the real-model path (`model.path`, chat templates, math-verify rewards, LoRA) on a CPU without
downloading a model: the tokenizer is trained on the training problems, the model is randomly initialised and,
with `--sft-steps`, warm-started by a short supervised pass that teaches it to answer `\\boxed{<answer>}` for
the training problems (only those: the task's held-out split is left alone), so RL has rewards to work with.
A model this small memorises answers; it does not learn arithmetic. Saved like a Hub model
(`save_pretrained`), loadable by transformers and by `model.path`.

    python -m heterorl.tiny_model models/tiny-qwen3 --config configs/examples/math-cpu-tiny.yaml --sft-steps 60

With `--config`, the problems and their held-out split are the run config's math task (so the warm start never
sees a problem the run evaluates on); `--data FILE` takes a file with the math task's default split.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast, Qwen3Config

from heterorl.config import MathTaskConfig, load_config
from heterorl.console import progress_bar
from heterorl.policy import Policy
from heterorl.tasks import Problem, make_task

SPECIAL_TOKENS = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
EXTRA_TEXT = "\\boxed{12} 0123456789 + - * / = ( ) . ,"  # so digits, operators and \boxed{} are in the vocabulary


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (any text encodes) trained on `texts`, with pad/eos/unk and a chat template."""
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator([*texts, EXTRA_TEXT], trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_qwen3(tok: PreTrainedTokenizerFast, hidden: int, layers: int, seed: int) -> PreTrainedModel:
    """A randomly initialised Qwen3 for `tok` (head_dim 16, grouped-query attention, tied embeddings)."""
    heads = max(1, hidden // 16)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=16,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg)


def supervised_loss_of(policy: Policy, problems: list[Problem]) -> torch.Tensor:
    """Mean negative log-likelihood of `\\boxed{answer}` + eos after each problem's prompt."""
    from heterorl.pretrain import supervised_loss

    return supervised_loss(policy, [p.prompt for p in problems], [f"\\boxed{{{p.answer}}}" for p in problems])


def warm_start(policy: Policy, problems: list[Problem], steps: int, lr: float, batch_size: int, seed: int) -> float:
    """Supervised steps on `\\boxed{answer}` completions of `problems`; returns the loss over all of them."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=lr)
    policy.model.train()
    with progress_bar("warm start", total=steps) as bar:
        for _ in range(steps):
            loss = supervised_loss_of(policy, [rng.choice(problems) for _ in range(batch_size)])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
            optimizer.step()
            bar.advance(1, loss=loss.item())
    policy.model.eval()
    with torch.no_grad():
        return float(supervised_loss_of(policy, problems))


def make_tiny_model(
    out: Path,
    task_cfg: MathTaskConfig,
    vocab_size: int = 400,
    hidden: int = 64,
    layers: int = 2,
    sft_steps: int = 0,
    lr: float = 3e-3,
    batch_size: int = 16,
    seed: int = 0,
) -> Path:
    """Build the tokenizer and model from the training problems of the math task `task_cfg` (prompts as the run
    sees them, as a user turn of the chat template) and save both into `out`."""
    task = make_task(task_cfg.model_copy(update={"chat_template": True}), rewards=False)
    problems = task.train_problems
    tok = train_tokenizer([p.prompt for p in problems] + [p.answer for p in problems], vocab_size)
    policy = Policy(build_qwen3(tok, hidden, layers, seed), tok, torch.device("cpu"), chat_template=True)
    if sft_steps:
        warm_start(policy, problems, sft_steps, lr, batch_size, seed)
    out.mkdir(parents=True, exist_ok=True)
    policy.save(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m heterorl.tiny_model", description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="Directory to write the model and tokenizer into.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="Run config whose math task (data, split) to use.")
    source.add_argument("--data", type=Path, help="Problems file (fields problem, answer; the default split).")
    parser.add_argument("--vocab-size", type=int, default=400, help="BPE vocabulary size.")
    parser.add_argument("--hidden", type=int, default=64, help="Hidden size (a multiple of 16).")
    parser.add_argument("--layers", type=int, default=2, help="Decoder layers.")
    parser.add_argument("--sft-steps", type=int, default=0, help="Supervised warm-start steps (0: random weights).")
    parser.add_argument("--lr", type=float, default=3e-3, help="Warm-start learning rate.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the weights and the warm start.")
    args = parser.parse_args(argv)
    if args.hidden % 16:
        parser.error("--hidden must be a multiple of 16")
    task_cfg = load_config(args.config).task if args.config else MathTaskConfig(path=str(args.data))
    if not isinstance(task_cfg, MathTaskConfig):
        parser.error(f"{args.config}: task.name is {task_cfg.name!r}; the tiny model is built for a math task")
    path = make_tiny_model(
        args.out, task_cfg, args.vocab_size, args.hidden, args.layers, args.sft_steps, args.lr, seed=args.seed
    )
    print(f"tiny model: {path}")


if __name__ == "__main__":  # pragma: no cover
    main()
