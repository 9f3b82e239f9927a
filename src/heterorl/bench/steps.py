"""Realistic weight-update steps for codec measurements: bf16 versions of a model one optimizer step apart.

Sources, shared by the benchmarks (`heterorl sync bench --step ...`, benchmarks/pulse_bench.py) and the tests:

* `synthetic_step`: fp32 masters in Llama-like shapes and one update w - lr * sign(g) (Adam's first step), or
  with `change_rate` that share of bf16 elements moved by one ULP at uniformly random positions (no context
  can help there: the positions do not depend on anything the receiver knows);
* `noise_step`: synthetic fp32 master weights (N(0, 0.02), norm weights 1 + N(0, 0.02), in a Qwen/Llama-like
  set of shapes) plus an Adam-like update lr * z with z ~ N(0, 1) per element, both views rounded to bf16.
  Unlike synthetic_step's lr * sign(g) (Adam's first step exactly), the step sizes vary per element, as
  they do after the first few Adam steps.
* `qwen3_versions`: a ~100M-parameter Qwen3 (full 151,936-token vocabulary, tied embeddings as Qwen3-0.6B,
  random init from transformers) taking real AdamW SFT steps on procedurally generated token sequences, fp32
  master weights, publishing the bf16 view after every step as `Learner.export_weights` does.
* `demo_versions`: the demo run's RL steps: the cached demo base model (`heterorl pretrain configs/demo.yaml`),
  a real `Learner` (GEPO, the demo config's lr) trained on groups that a real `Sampler` generates and scores.

The real-training sources take minutes on 2 CPU cores, so their versions are cached as safetensors under
`$HETERORL_CACHE/pulse-steps/<key>/`, keyed by every argument that determines them.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch

Versions = list[dict[str, torch.Tensor]]
Pair = tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]

QWEN3_VOCAB = 151_936


def synthetic_shapes(num_params: int) -> dict[str, tuple[int, ...]]:
    """A decoder-only transformer's tensor shapes totalling roughly `num_params` (hidden d, GQA kv = d/4)."""
    d = max(64, 2 ** round(math.log2(math.sqrt(num_params / (24 * 10.5)))))
    ff = max(64, round(8 * d / 3 / 64) * 64)
    vocab = min(32768, 8 * d)
    per_layer = 2 * d * d + 2 * d * (d // 4) + 3 * d * ff + 2 * d
    layers = max(1, round((num_params - vocab * d - d) / per_layer))
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (vocab, d), "norm.weight": (d,)}
    for i in range(layers):
        p = f"layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (d, d),
            p + "self_attn.k_proj.weight": (d // 4, d),
            p + "self_attn.v_proj.weight": (d // 4, d),
            p + "self_attn.o_proj.weight": (d, d),
            p + "mlp.gate_proj.weight": (ff, d),
            p + "mlp.up_proj.weight": (ff, d),
            p + "mlp.down_proj.weight": (d, ff),
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
        }
    return shapes


def _master(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """A synthetic fp32 master tensor: N(0, 0.02), plus 1 for norm weights."""
    master = torch.randn(shape, generator=gen).mul_(0.02)
    if name.endswith("norm.weight"):
        master += 1.0
    return master


def synthetic_step(
    num_params: int, change_rate: float | None, lr: float, seed: int
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(base, new) bf16 state dicts one optimizer step apart; generated tensor by tensor to bound memory."""
    gen = torch.Generator().manual_seed(seed)
    base, new = {}, {}
    for name, shape in synthetic_shapes(num_params).items():
        master = _master(name, shape, gen)
        base[name] = master.bfloat16()
        if change_rate is None:
            step = torch.randn(shape, generator=gen).sign_().mul_(lr)
            new[name] = master.sub_(step).bfloat16()
        else:
            bits = base[name].view(torch.int16)
            ulp = torch.randint(0, 2, shape, generator=gen, dtype=torch.int16).mul_(2).sub_(1)
            moved = torch.rand(shape, generator=gen) < change_rate
            new[name] = torch.where(moved, bits + ulp, bits).view(torch.bfloat16)
        del master
    return base, new


def noise_step(
    num_params: int = 70_000_000, lr: float = 1e-6, seed: int = 0
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(base, new) bf16: masters w ~ N(0, 0.02) (norms 1 + N(0, 0.02)), new = w - lr * z, z ~ N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    base, new = {}, {}
    for name, shape in synthetic_shapes(num_params).items():
        master = _master(name, shape, gen)
        base[name] = master.bfloat16()
        new[name] = master.sub_(torch.randn(shape, generator=gen).mul_(lr)).bfloat16()
        del master
    return base, new


def _cached(key: dict, build: Callable[[], Versions], refresh: bool = False) -> Versions:
    """Versions from the cache directory for `key`, building and saving them first if absent."""
    from safetensors.torch import load_file, save_file

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("HETERORL_CACHE", Path.home() / ".cache" / "heterorl"))  # as pretrain.cache_dir
    out = cache / "pulse-steps" / f"{key['source']}-{digest}"
    marker = out / "key.json"
    if marker.is_file() and not refresh:
        count = json.loads(marker.read_text())["versions"]
        return [load_file(out / f"v{i}.safetensors") for i in range(count)]
    versions = build()
    out.mkdir(parents=True, exist_ok=True)
    for i, weights in enumerate(versions):
        save_file(weights, out / f"v{i}.safetensors")
    marker.write_text(json.dumps({**key, "versions": len(versions)}, sort_keys=True) + "\n")
    return versions


def qwen3_config(hidden: int = 512, layers: int = 4, vocab: int = QWEN3_VOCAB):
    """A Qwen3 config shaped like Qwen3-0.6B (GQA 2:1, head_dim 64 here, tied embeddings), scaled down."""
    from transformers import Qwen3Config

    heads = max(1, hidden // 64)
    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=64,
        tie_word_embeddings=True,
        max_position_embeddings=1024,
    )


def procedural_tokens(batch: int, length: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Token sequences [batch, length] with learnable structure over the whole vocabulary.

    Each sequence picks a Zipf-distributed "topic" token range (so frequent and rare ids both occur) and
    repeats a short random motif from it with random substitutions: a model can learn to copy the motif.
    """
    ranks = torch.arange(1, vocab + 1, dtype=torch.float64)
    zipf = ranks.pow(-1.1)
    out = torch.empty(batch, length, dtype=torch.long)
    for b in range(batch):
        motif = torch.multinomial(zipf, 8, replacement=True, generator=gen)
        seq = motif.repeat(-(-length // 8))[:length].clone()
        noise = torch.rand(length, generator=gen) < 0.15
        seq[noise] = torch.multinomial(zipf, int(noise.sum()), replacement=True, generator=gen)
        out[b] = seq
    return out


def qwen3_versions(
    steps: int = 4,
    lr: float = 1e-5,
    *,
    hidden: int = 512,
    layers: int = 4,
    vocab: int = QWEN3_VOCAB,
    batch: int = 4,
    length: int = 128,
    weight_decay: float = 0.01,
    seed: int = 0,
    refresh: bool = False,
) -> Versions:
    """bf16 views of a ~100M-parameter Qwen3 before and after each of `steps` AdamW SFT steps (cached)."""
    key = {
        "source": "qwen3",
        "steps": steps,
        "lr": lr,
        "hidden": hidden,
        "layers": layers,
        "vocab": vocab,
        "batch": batch,
        "length": length,
        "weight_decay": weight_decay,
        "seed": seed,
        "format": 1,
    }

    def build() -> Versions:
        from transformers import Qwen3ForCausalLM

        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(qwen3_config(hidden, layers, vocab)).float().train()
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=weight_decay)
        gen = torch.Generator().manual_seed(seed + 1)
        versions = [_bf16_view(model)]
        for _ in range(steps):
            ids = procedural_tokens(batch, length, model.config.vocab_size, gen)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            versions.append(_bf16_view(model))
        return versions

    return _cached(key, build, refresh)


def demo_versions(steps: int = 6, *, seed: int = 0, refresh: bool = False) -> Versions:
    """bf16 views of the demo's learner (configs/demo.yaml: GEPO, lr 1e-4) before and after `steps` RL steps."""
    from heterorl.config import load_config
    from heterorl.run.build import build_learner, build_sampler, resolve_base_model

    config_path = Path(__file__).resolve().parents[3] / "configs" / "demo.yaml"  # src/heterorl/bench -> repo
    cfg = load_config(config_path if config_path.is_file() else None, [f"seed={seed}"])
    base, _ = resolve_base_model(cfg, show_progress=False)
    key = {"source": "demo", "steps": steps, "seed": seed, "base": Path(base).name, "lr": cfg.learner.lr, "format": 1}

    def build() -> Versions:
        torch.manual_seed(seed)
        learner = build_learner(cfg, base)
        sampler = build_sampler(cfg, 0, base)
        versions = [learner.export_weights()]
        for _ in range(steps):
            sampler.load_weights(learner.version, versions[-1])
            learner.train_step(sampler.generate_groups(cfg.learner.groups_per_step))
            versions.append(learner.export_weights())
        return versions

    return _cached(key, build, refresh)


def _bf16_view(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a sampler receives: each parameter once (tied weights under their first name), cast to bf16."""
    return {name: p.detach().to(torch.bfloat16, copy=True) for name, p in model.named_parameters()}


def num_params(weights: dict[str, torch.Tensor]) -> int:
    return sum(math.prod(t.shape) for t in weights.values())


STEPS = ("synthetic", "noise", "qwen3", "demo")


def step_pair(
    kind: str, num_params: int = 70_000_000, lr: float = 1e-6, change_rate: float | None = None, seed: int = 0
) -> Pair:
    """(base, new) bf16 weights of one step of `kind` (STEPS): `synthetic` and `noise` at `num_params`; `qwen3`
    (~90M parameters, the step from version 3 to 4 at `lr`, after three warm-up steps) and `demo` (the step from
    version 5 to 6 of the demo's RL run) at their own sizes."""
    if kind == "synthetic":
        return synthetic_step(num_params, change_rate, lr, seed)
    if kind == "noise":
        return noise_step(num_params, lr, seed)
    if kind == "qwen3":
        versions = qwen3_versions(4, lr, seed=seed)
        return versions[3], versions[4]
    if kind == "demo":
        versions = demo_versions(6, seed=seed)
        return versions[5], versions[6]
    raise ValueError(f"unknown step kind {kind!r} (choices: {STEPS})")
