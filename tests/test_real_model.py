"""A real-model path on CPU: a Qwen3-style model with a trained byte-level BPE tokenizer and a chat template,
loaded through `model.path`, post-trained on the shipped math JSONL with math-verify rewards; LoRA adapters
published alone or merged; a custom reward by import path."""

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import DATA, capture_records, math_config
from heterorl.errors import PathNotFoundError
from heterorl.run.build import build_sampler
from heterorl.simulated.run import build_simulated, execute
from heterorl.weights import load_snapshot


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
    sampler = build_sampler(cfg, 0, str(qwen_dir))
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


def _cluster(cfg, base: Path, run_dir: Path):
    cluster = build_simulated(cfg, run_dir, str(base))
    return cluster, capture_records(cluster)


def test_lora_publishes_only_adapter_tensors(qwen_dir: Path, reward_module: str, tmp_path: Path) -> None:
    cfg = math_config(
        qwen_dir, "model.lora={rank: 4, alpha: 8, target_modules: [q_proj, v_proj]}", f"task.reward={reward_module}"
    )
    cluster, records = _cluster(cfg, qwen_dir, tmp_path)
    cluster.run()
    cluster.loop.publisher.close()
    learner, store = cluster.loop.learner, cluster.loop.store
    assert any(r["reward/mean"] > 0 for r in records)  # the custom reward drove training
    published = load_snapshot(store.update_for(None, None).snapshot)
    assert published
    assert all(".lora_A." in n or ".lora_B." in n for n in published)
    assert learner.export_weights().keys() == published.keys()
    total = sum(p.numel() for p in learner.policy.model.parameters())
    assert sum(t.numel() for t in published.values()) < total / 10
    # the sampler's adapters are the learner's, bit for bit, and its base weights never moved
    worker = cluster.nodes[0].worker
    assert worker.receive(store.update_for(*worker.held()))  # catch up to the newest
    worker.refresh()
    assert worker.version == learner.version
    sampler_params = dict(worker.sampler.engine.policy.model.named_parameters())
    for name, t in learner.export_weights().items():
        assert torch.equal(sampler_params[name].detach(), t.float())
    base = AutoModelForCausalLM.from_pretrained(qwen_dir)
    q = worker.sampler.engine.policy.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer.weight
    assert torch.equal(q, base.model.layers[0].self_attn.q_proj.weight)


def test_lora_merged_publishes_full_weights_under_plain_names(qwen_dir: Path, reward_module: str, tmp_path) -> None:
    cfg = math_config(qwen_dir, "model.lora={rank: 4, publish: merged}", f"task.reward={reward_module}")
    cluster, _ = _cluster(cfg, qwen_dir, tmp_path)
    cluster.run()
    cluster.loop.publisher.close()
    plain = AutoModelForCausalLM.from_pretrained(qwen_dir)
    published = cluster.loop.learner.export_weights()
    assert published.keys() == dict(plain.named_parameters()).keys()
    learner = cluster.loop.learner.policy.model
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
    with pytest.raises(PathNotFoundError, match=r"no-such-model.* is not a transformers checkpoint"):
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
    sampler = build_sampler(cfg, 0, str(tmp_path / "tiny"))
    assert sampler.engine.policy.tokenizer.chat_template
