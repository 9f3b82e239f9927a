"""One loop, two clocks: the live cluster (real processes on loopback) runs the very loop the simulator runs.

- a synchronous run with one sampler and no delay writes the same metrics.jsonl under both clocks, apart from
  the keys that measure speed (`recorder.CLOCK_DEPENDENT`);
- the how-to's kind of model runs live end to end: a transformers checkpoint with a chat template, LoRA adapters
  published alone, bf16 samplers, frictions — samplers hold exactly what the learner published, the learner
  accepts their prompts as its own tokenization (chat template included), frictions are counted;
- AReaL's admission (`cluster.eta`) bounds the staleness of every trained group live as in the simulator.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import math_config, smoke_config, tiny_config
from heterorl.eventlog import read_events
from heterorl.live.launcher import run_live
from heterorl.metrics import read_metrics
from heterorl.run.recorder import CLOCK_DEPENDENT
from heterorl.simulated.run import execute


def _clock_free(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not CLOCK_DEPENDENT.match(k)} for r in records]


@pytest.mark.processes
def test_a_live_run_writes_the_metrics_of_the_simulated_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETERORL_VERIFY_KEY", "one key for both clocks")  # a live learner's is random by default
    cfg = smoke_config("learner.steps=6", "eval.every=3", "weights.codec=pulse", "weights.snapshot_every=4")
    sim_summary = execute(cfg, tmp_path / "sim", show_progress=False)
    live_summary = run_live(cfg, tmp_path / "live", show_progress=False)
    simulated = read_metrics(tmp_path / "sim" / "metrics.jsonl")
    live = read_metrics(tmp_path / "live" / "metrics.jsonl")
    assert [r["kind"] for r in live] == [r["kind"] for r in simulated]
    assert len([r for r in live if r["kind"] == "train"]) == 6
    assert {k for r in live for k in r} == {k for r in simulated for k in r}  # the same keys, both clocks
    assert _clock_free(live) == _clock_free(simulated)
    per_sampler = {
        f"sampler/sampler-0/{k}" for k in ("accepted_total", "trained_total", "stale_mean", "stale_max", "lag")
    }
    last_train = [r for r in live if r["kind"] == "train"][-1]
    assert per_sampler <= set(last_train)  # the per-sampler figures, recorded alike under both clocks
    assert live_summary["per_sampler"] == sim_summary["per_sampler"]
    assert live_summary["per_sampler"]["sampler-0"]["trained"] == 6 * cfg.learner.groups_per_step
    assert any(r["sync/changed_share"] < 1 for r in live if r["kind"] == "train")  # PULSE patches travelled


@pytest.fixture
def digits_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A dense custom reward importable by the child processes (PYTHONPATH), so LoRA adapters really move."""
    (tmp_path / "live_rewards.py").write_text(
        "def digits(prompt, completion, answer, **info):\n"
        "    return sum(c.isdigit() for c in completion) / max(len(completion), 1)\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return "live_rewards:digits"


@pytest.mark.processes
def test_lora_bf16_chat_template_and_frictions_run_live_end_to_end(
    tmp_path: Path, qwen_dir: Path, digits_reward: str
) -> None:
    cfg = math_config(
        qwen_dir,
        f"task.reward={digits_reward}",
        "model.lora={rank: 4, alpha: 8, publish: adapter}",
        "model.dtype=bfloat16",
        "sampler.frictions={actor_bug: 0.2, rare_discovery: 0.2, reward_corruption: 0.2}",
        "trust.recheck_rewards=false",
        "trust.verify.fraction=0",
        "cluster.mode=async",
        "cluster.samplers=[{name: a}, {name: b}]",
        "weights.codec=pulse",
        "learner.steps=4",
    )
    run = tmp_path / "run"
    summary = run_live(cfg, run, show_progress=False)
    assert summary["steps"] == 4
    train = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    # the learner re-tokenizes every prompt with its chat template: none was refused, all were trained
    assert all(r["net/rejected_prompt_mismatch"] == 0 for r in train)
    assert train[-1]["net/accepted_total"] >= 4 * cfg.learner.groups_per_step
    # frictions were injected by the samplers and counted by the learner
    assert train[-1]["frictions/actor_bug_total"] > 0
    assert train[-1]["frictions/reward_corruption_total"] > 0
    # every version a sampler held (its hash verified after applying) is one the learner published
    published = {(e["version"], e["hash"]) for e in read_events(run / "live" / "learner.log", "published")}
    assert len(published) == 5  # versions 0..4
    for name in ("sampler-0", "sampler-1"):
        held = [(e["version"], e["hash"]) for e in read_events(run / "live" / f"{name}.log", "weights") if e["ok"]]
        assert held, name
        assert set(held) <= published, name
        assert len(set(held)) >= 2, name  # it followed the learner past the first snapshot
    assert any(r["obj/is_weight_var"] > 0 for r in train)  # bf16 samplers: behaviour log-probs of their own


def test_a_sampler_without_the_learners_chat_template_is_refused(tmp_path: Path, qwen_dir: Path) -> None:
    """The drift the one-loop issue found (a sampler tokenizing prompts differently) is caught and counted."""
    from heterorl.rollout_codec import encode_group
    from heterorl.run.build import build_sampler
    from heterorl.simulated.run import build_simulated

    learner_cfg = math_config(qwen_dir)
    cluster = build_simulated(learner_cfg, tmp_path, str(qwen_dir))
    loop = cluster.loop
    loop.start()
    plain = build_sampler(math_config(qwen_dir, "task.chat_template=false"), 0, str(qwen_dir))
    loop.publisher.result()
    plain.load_weights(0, loop.learner.export_weights())
    verdicts = [loop.offer(encode_group(g)) for g in plain.generate_groups(2)]
    assert [v.outcome for v in verdicts] == ["prompt_mismatch", "prompt_mismatch"]
    assert loop.intake.counters.rejected["prompt_mismatch"] == 2
    templated = build_sampler(learner_cfg, 0, str(qwen_dir))
    templated.load_weights(0, loop.learner.export_weights())
    assert [loop.offer(encode_group(g)).outcome for g in templated.generate_groups(2)] == ["accepted"] * 2
    loop.publisher.close()


@pytest.mark.processes
def test_admission_bounds_the_staleness_of_every_group_trained_live(tmp_path: Path, tiny_model_dir: Path) -> None:
    eta = 1
    cfg = tiny_config(
        tiny_model_dir,
        "cluster.mode=async",
        f"cluster.eta={eta}",
        "cluster.samplers=[{name: a}, {name: b}]",
        "learner.steps=8",
        "weights.codec=pulse",
        "live.poll_seconds=0.5",
    )
    run = tmp_path / "run"
    run_live(cfg, run, show_progress=False)
    train = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    assert len(train) == 8
    assert max(r["stale/max"] for r in train) <= eta
    trained = sum(r["perf/groups"] for r in train)
    assert train[-1]["stale/dropped_total"] <= 0.25 * trained  # admission, not the window, did the work
