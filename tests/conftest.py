"""Shared fixtures: a tiny random checkpoint (fast component tests) and an isolated base-model cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen3Config

from heterorl.config import ModelConfig, RunConfig, load_config
from heterorl.policy import Policy

REPO = Path(__file__).resolve().parents[1]
TINY_MODEL = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 1-layer Qwen3-style checkpoint with the character tokenizer."""
    path = tmp_path_factory.mktemp("tiny-model")
    Policy.from_config(ModelConfig(**TINY_MODEL), seed=0).save(path)
    return path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One base-model cache for the whole session (the smoke base model is built once)."""
    return tmp_path_factory.mktemp("heterorl-cache")


@pytest.fixture(autouse=True)
def _isolated_cache(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETERORL_CACHE", str(cache_dir))


def tiny_config(model_dir: Path, *overrides: str) -> RunConfig:
    """A fast run on the tiny checkpoint: 1-digit addition, short completions, small batches."""
    base = [
        f"model.path={model_dir}",
        "task.name=addition",
        "task.digits=1",
        "task.eval_size=16",
        "sampler.group_size=4",
        "sampler.max_new_tokens=3",
        "learner.steps=6",
        "learner.groups_per_step=4",
        "learner.lr=1e-3",
        "eval.every=3",
        "weights.codec=full",
    ]
    return load_config(None, [*base, *overrides])


def smoke_config(*overrides: str) -> RunConfig:
    return load_config(REPO / "configs" / "smoke.yaml", list(overrides))


def capture_records(cluster) -> list[dict]:
    """The train records a simulated cluster's loop writes, as they are written."""
    records: list[dict] = []
    recorder = cluster.loop.recorder
    on_step = recorder.on_step

    def capture(record: dict) -> None:
        records.append(record)
        on_step(record)

    recorder.on_step = capture
    return records


DATA = Path(__file__).parent / "data" / "math_small.jsonl"
CHAT = (
    "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 and a 400-token byte-level BPE tokenizer trained on the problems, saved like a hub model."""
    path = tmp_path_factory.mktemp("qwen3-tiny")
    texts = [json.loads(line)["problem"] for line in DATA.read_text().splitlines()]
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    special = ["<pad>", "<eos>", "<unk>", "<|user|>", "<|assistant|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator([*texts, "\\boxed{12} 0123456789 + - * / = ( )"], trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )
    tok.chat_template = CHAT
    tok.save_pretrained(path)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return path


def math_config(model_dir: Path, *overrides: str):
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            "task.name=math",
            f"task.path={DATA}",
            "task.chat_template=true",
            "task.eval_size=8",
            "sampler.group_size=4",
            "sampler.max_new_tokens=6",
            "learner.steps=3",
            "learner.groups_per_step=4",
            "learner.lr=1e-3",
            "eval.every=3",
            "objective.name=gepo",
            *overrides,
        ],
    )
