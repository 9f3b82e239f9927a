"""Adversarial samplers for the simulator: each kind changes what it sends as documented, and only that; their
config names real sampler nodes and does not mix with the frictions the trust checks would refuse."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from heterorl.adversaries import Adversary
from heterorl.config import AdversaryConfig, ReversalTaskConfig, load_config
from heterorl.engines.transformers_engine import TransformersEngine
from heterorl.policy import Policy, SamplingParams
from heterorl.sampler import Sampler
from heterorl.tasks import make_task

PARAMS = SamplingParams(max_new_tokens=6)


def sampler(model_dir: Path, adversary: Adversary | None, seed: int = 0) -> Sampler:
    policy = Policy.load(model_dir)
    task = make_task(ReversalTaskConfig(alphabet="ab", min_length=3, max_length=5))
    s = Sampler.from_policy("s", policy, task, PARAMS, group_size=4, seed=seed, adversary=adversary)
    s.load_weights(7, {n: p.detach().clone() for n, p in policy.model.named_parameters()})
    return s


def pair(model_dir: Path, cfg: AdversaryConfig, other=None):
    """An honest sampler and a lying one on the same seed: the same prompts and draws."""
    return sampler(model_dir, None).generate_groups(6), sampler(model_dir, Adversary(cfg, 1, other)).generate_groups(6)


def test_forged_logprobs_shift_every_token_and_stay_in_range(tiny_model_dir: Path) -> None:
    honest, lies = pair(tiny_model_dir, AdversaryConfig(kind="forged_logprobs", logprob_shift=-1.5))
    for h, bad in zip(honest, lies, strict=True):
        mask = h.completion_mask_GL.bool()
        assert torch.allclose(bad.behavior_logp_GL[mask], h.behavior_logp_GL[mask] - 1.5)
        assert torch.equal(bad.completion_ids_GL, h.completion_ids_GL)
        assert torch.equal(bad.rewards_G, h.rewards_G)
    up = pair(tiny_model_dir, AdversaryConfig(kind="forged_logprobs", logprob_shift=5.0))[1]
    assert all(float(g.behavior_logp_GL.max()) <= 0.0 for g in up)


def test_poison_is_one_token_at_minus_70_in_a_below_average_completion(tiny_model_dir: Path) -> None:
    honest, lies = pair(tiny_model_dir, AdversaryConfig(kind="poison"))
    for h, bad in zip(honest, lies, strict=True):
        changed = (bad.behavior_logp_GL != h.behavior_logp_GL).nonzero().tolist()
        if float(h.rewards_G.min()) == float(h.rewards_G.max()):
            assert changed == []  # no negative advantage: the poison would be clipped away, so it is not sent
            continue
        ((row, col),) = changed
        assert col == 0
        assert float(bad.behavior_logp_GL[row, col]) == -70.0
        assert float(h.rewards_G[row]) < float(h.rewards_G.mean())


def test_forged_rewards_are_inverted(tiny_model_dir: Path) -> None:
    honest, lies = pair(tiny_model_dir, AdversaryConfig(kind="forged_rewards"))
    for h, bad in zip(honest, lies, strict=True):
        assert torch.equal(bad.rewards_G, 1.0 - h.rewards_G)


def test_replays_are_old_groups_under_new_ids_and_the_current_version(tiny_model_dir: Path) -> None:
    adversary = Adversary(AdversaryConfig(kind="replay", share=0.5), 3)
    s = sampler(tiny_model_dir, adversary)
    sent = s.generate_groups(4)
    s.load_weights(9, {n: p.detach().clone() for n, p in s.engine.policy.model.named_parameters()})
    later = s.generate_groups(12)
    seen: set[bytes] = set()
    replays = []
    for g in sent + later:  # a group whose completions came before is a replay
        key = g.completion_ids_GL.numpy().tobytes()
        if key in seen:
            replays.append(g)
        seen.add(key)
    assert len(replays) == adversary.counts["tampered"] > 0
    late = {g.group_id for g in later}
    assert all(int(g.version_GL.min()) == (9 if g.group_id in late else 7) for g in replays)  # looks fresh
    assert len({g.group_id for g in sent + later}) == 16  # every id is fresh


def test_other_model_completions_under_the_claimed_version(tiny_model_dir: Path, tmp_path: Path) -> None:
    other_policy = Policy.load(tiny_model_dir)
    with torch.no_grad():
        for p in other_policy.model.parameters():
            p.mul_(1.5)  # another model
    other = TransformersEngine(other_policy, seed=5)
    other.load_weights(0, {n: p.detach().clone() for n, p in other_policy.model.named_parameters()})
    honest, lies = pair(tiny_model_dir, AdversaryConfig(kind="other_model", rescore=True), other)
    s = sampler(tiny_model_dir, None)
    for bad in lies:
        assert int(bad.version_GL.max()) == 7  # the version it claims
        ids, mask = s.engine.policy.encode_prompts([bad.prompt] * bad.size)
        claimed = s.engine.score(ids, mask, bad.completion_ids_GL, bad.completion_mask_GL, PARAMS)
        assert torch.allclose(bad.behavior_logp_GL, claimed, atol=1e-6)  # re-scored: log-probs look honest
    assert any(not torch.equal(h.completion_ids_GL, b.completion_ids_GL) for h, b in zip(honest, lies, strict=True))


def test_adversaries_must_name_sampler_nodes_and_frictions_need_the_checks_off() -> None:
    cfg = load_config(None, ["cluster.samplers=[{name: a}, {name: b}]", "adversaries={b: {kind: replay}}"])
    assert cfg.adversaries["b"].kind == "replay"
    with pytest.raises(ValueError, match=r"adversaries \['c'\] are not sampler nodes"):
        load_config(None, ["cluster.samplers=[{name: a}]", "adversaries={c: {kind: replay}}"])
    with pytest.raises(ValueError, match=r"trust\.recheck_rewards: false"):
        load_config(None, ["sampler.frictions.reward_corruption=0.2"])
    load_config(
        None, ["sampler.frictions.reward_corruption=0.2", "trust.recheck_rewards=false", "trust.verify.fraction=0"]
    )


def test_a_lying_sampler_in_the_simulator_is_caught_quarantined_and_stopped_while_the_run_goes_on(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Through proto's SamplerNode and session on the virtual clock: the liar's groups are refused and charged
    (reward_mismatch) until it is quarantined; its next upload is refused whole, its session stops, and the honest
    sampler alone finishes the run."""
    from conftest import tiny_config
    from heterorl.simulated.run import execute

    cfg = tiny_config(
        tiny_model_dir,
        "learner.steps=4",
        "eval.every=4",
        "cluster.mode=async",
        "cluster.eta=1",
        "cluster.samplers=[{name: honest}, {name: liar}]",
        "adversaries={liar: {kind: forged_rewards}}",
        "trust.reputation={window: 8, max_charges: 2}",
    )
    summary = execute(cfg, tmp_path / "run", show_progress=False)
    liar, honest = summary["trust"]["liar"], summary["trust"]["honest"]
    assert liar["accepted"] == 0
    assert liar["refused"]["reward_mismatch"] >= 2
    assert liar["quarantined_at"] is not None
    assert honest["accepted"] >= 4 * cfg.learner.groups_per_step
    assert sum(honest["refused"].values()) == 0
    assert summary["net"]["rejected"]["reward_mismatch"] == liar["refused"]["reward_mismatch"]
    assert "refused it as 'quarantined'" in summary["samplers"]["liar"]["stopped"]
    assert summary["samplers"]["honest"]["stopped"] is None
    assert summary["admission"]["samplers"]["liar"]["outstanding"] == 0
