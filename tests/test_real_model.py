"""A real-model path on CPU: a Qwen3-style model with a trained byte-level BPE tokenizer and a chat template,
loaded through `model.path`, post-trained on the shipped math JSONL with math-verify rewards; LoRA adapters
published alone or merged; a custom reward by import path."""

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from heterorl.cluster.simulated import SimulatedCluster
from heterorl.config import load_config
from heterorl.run import execute, make_learner, make_sampler
from heterorl.tiny_model import build_qwen3, train_tokenizer
from heterorl.weights import load_snapshot

DATA = Path(__file__).parent / "data" / "math_small.jsonl"


@pytest.fixture(scope="module")
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


def test_math_run_with_math_verify_rewards(qwen_dir: Path, tmp_path: Path) -> None:
    summary = execute(math_config(qwen_dir), tmp_path / "run", show_progress=False)
    assert summary["steps"] == 3
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3]
    # the checkpoint is a transformers model with the trained BPE tokenizer and its chat template
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoint")
    assert loaded.config.vocab_size == 400
    assert "<|assistant|>" in (tmp_path / "run" / "checkpoint" / "tokenizer_config.json").read_text() + (
        (tmp_path / "run" / "checkpoint" / "chat_template.jinja").read_text()
        if (tmp_path / "run" / "checkpoint" / "chat_template.jinja").exists()
        else ""
    )


def test_prompts_are_wrapped_by_the_chat_template(qwen_dir: Path) -> None:
    cfg = math_config(qwen_dir)
    sampler = make_sampler(cfg, str(qwen_dir), 0)
    ids, mask = sampler.engine.policy.encode_prompts(["Solve for x: 4x + 7 = 31."])
    text = sampler.engine.policy.tokenizer.decode(ids[0][mask[0].bool()])
    assert text.startswith("<|user|>")
    assert text.endswith("<|assistant|>")


@pytest.fixture
def reward_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A custom reward on the import path: the share of digits in the completion (dense, so LoRA moves)."""
    (tmp_path / "my_rewards.py").write_text(
        "def digits(prompt, completion, answer, **info):\n"
        "    return sum(c.isdigit() for c in completion) / max(len(completion), 1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards:digits"
    sys.modules.pop("my_rewards", None)


def _cluster(cfg, base: Path):
    learner = make_learner(cfg, str(base))
    samplers = [make_sampler(cfg, str(base), 0)]
    records: list[dict] = []
    return SimulatedCluster(cfg, learner, samplers, records.append), records


def test_lora_publishes_only_adapter_tensors(qwen_dir: Path, reward_module: str) -> None:
    cfg = math_config(
        qwen_dir, "model.lora={rank: 4, alpha: 8, target_modules: [q_proj, v_proj]}", f"task.reward={reward_module}"
    )
    cluster, records = _cluster(cfg, qwen_dir)
    cluster.run()
    assert any(r["reward/mean"] > 0 for r in records)  # the custom reward drove training
    published = load_snapshot(cluster.publisher.store.update_for(None, None).snapshot)
    assert published
    assert all(".lora_A." in n or ".lora_B." in n for n in published)
    assert cluster.learner.export_weights().keys() == published.keys()
    total = sum(p.numel() for p in cluster.learner.policy.model.parameters())
    assert sum(t.numel() for t in published.values()) < total / 10
    # the sampler's adapters are the learner's, bit for bit, and its base weights never moved
    node = cluster.nodes[0]
    assert node.receiver.apply(cluster.publisher.store.update_for(*node.receiver.held()))  # catch up to the newest
    node.sampler.load_weights(node.receiver.version, node.receiver.weights)
    assert node.sampler.version == cluster.learner.version
    sampler_params = dict(node.sampler.engine.policy.model.named_parameters())
    for name, t in cluster.learner.export_weights().items():
        assert torch.equal(sampler_params[name].detach(), t.float())
    base = AutoModelForCausalLM.from_pretrained(qwen_dir)
    q = node.sampler.engine.policy.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert torch.equal(q, base.model.layers[0].self_attn.q_proj.weight)


def test_lora_merged_publishes_full_weights_under_plain_names(qwen_dir: Path, reward_module: str) -> None:
    cfg = math_config(qwen_dir, "model.lora={rank: 4, publish: merged}", f"task.reward={reward_module}")
    cluster, _ = _cluster(cfg, qwen_dir)
    cluster.run()
    plain = AutoModelForCausalLM.from_pretrained(qwen_dir)
    published = cluster.learner.export_weights()
    assert published.keys() == dict(plain.named_parameters()).keys()
    learner = cluster.learner.policy.model
    delta = learner.base_model.model.model.layers[0].self_attn.q_proj.get_delta_weight("default")
    expected = plain.model.layers[0].self_attn.q_proj.weight + delta
    assert torch.equal(published["model.layers.0.self_attn.q_proj.weight"], expected.detach().to(torch.bfloat16))


def test_lora_checkpoint_is_merged_and_keeps_the_adapter(qwen_dir: Path, reward_module: str, tmp_path: Path) -> None:
    cfg = math_config(qwen_dir, "model.lora={rank: 4}", f"task.reward={reward_module}")
    execute(cfg, tmp_path / "run", show_progress=False)
    ckpt = tmp_path / "run" / "checkpoint"
    assert (ckpt / "adapter" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(ckpt)
    assert not any("lora" in n for n, _ in merged.named_parameters())


def test_missing_model_path_is_a_clear_error(tmp_path: Path) -> None:
    cfg = math_config(tmp_path / "no-such-model")
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        execute(cfg, tmp_path / "run", show_progress=False)


def test_the_tiny_model_builder_warm_starts_on_training_problems_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m heterorl.tiny_model --config`: the run config's split decides what the warm start sees, and the
    result loads through model.path with its chat template."""
    import heterorl.tiny_model as tiny
    from heterorl.tasks import make_task

    seen, losses = [], []
    real_warm_start = tiny.warm_start

    def spy(policy, problems, steps, lr, batch_size, seed):
        seen.extend(problems)
        with torch.no_grad():
            before = float(tiny.supervised_loss_of(policy, problems))
        losses.append((before, real_warm_start(policy, problems, steps, lr, batch_size, seed)))
        return losses[-1][1]

    monkeypatch.setattr(tiny, "warm_start", spy)
    config = tmp_path / "run.yaml"
    config.write_text(f"task: {{name: math, path: {DATA}, eval_fraction: 0.25}}\n")
    tiny.main([str(tmp_path / "tiny"), "--config", str(config), "--hidden", "32", "--layers", "1", "--sft-steps", "8"])
    cfg = math_config(tmp_path / "tiny", "task.eval_fraction=0.25")
    task = make_task(cfg.task)
    assert {p.prompt for p in seen} == {p.prompt for p in task.train_problems}
    assert losses[0][1] < losses[0][0]  # the warm start lowers the loss of `\boxed{answer}`
    sampler = make_sampler(cfg, str(tmp_path / "tiny"), 0)
    assert sampler.engine.policy.tokenizer.chat_template
