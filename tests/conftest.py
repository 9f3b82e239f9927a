"""Shared fixtures: a tiny random checkpoint (fast component tests) and an isolated base-model cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from heterorl.config import ModelConfig, RunConfig, load_config
from heterorl.policy import Policy
from heterorl.tiny_model import build_qwen3, train_tokenizer

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

    def capture(record: dict) -> float | None:
        records.append(record)
        return on_step(record)  # the accuracy when the step evaluated

    recorder.on_step = capture
    return records


DATA = Path(__file__).parent / "data" / "math_small.jsonl"


@pytest.fixture(scope="session")
def qwen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3 and a 400-token byte-level BPE tokenizer trained on the problems, saved like a hub model."""
    path = tmp_path_factory.mktemp("qwen3-tiny")
    texts = [json.loads(line)["problem"] for line in DATA.read_text().splitlines()]
    tok = train_tokenizer(texts, vocab_size=400)
    tok.save_pretrained(path)
    build_qwen3(tok, hidden=32, layers=1, seed=0).save_pretrained(path)
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
