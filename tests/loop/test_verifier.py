"""The rollout verifier: one forward pass under the claimed version gives back an honest sampler's log-probs (to
float rounding), catches shifted and impossible log-probs, and its calibration test is exactly uniform under
honest sampling; groups are picked by a keyed hash."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from heterorl.loop.verifier import RolloutVerifier, Tolerances, content, judge, pit, uniform_key
from heterorl.policy import Policy, SamplingParams
from heterorl.sampler import Sampler
from heterorl.tasks import make_task

TOL = Tolerances(mean=1e-3, token=1e-2, share_over=0.02, z=5.5)


def wire(policy: Policy) -> dict[str, torch.Tensor]:
    return {n: p.detach().to(torch.bfloat16).clone() for n, p in policy.model.named_parameters()}


@pytest.fixture(scope="module")
def setup(tiny_model_dir: Path):
    """Versions 3 and 4 (4 = 3 with its weights perturbed), a sampler holding 4, and 16 of its groups."""
    cfg = tiny_config(tiny_model_dir, "sampler.max_new_tokens=4")
    params = SamplingParams.from_config(cfg.sampler)
    v3 = wire(Policy.load(tiny_model_dir))
    gen = torch.Generator().manual_seed(0)
    v4 = {k: (t.float() + 0.05 * torch.randn(t.shape, generator=gen)).to(torch.bfloat16) for k, t in v3.items()}
    versions = {3: v3, 4: v4}
    sampler = Sampler.from_policy("s0", Policy.load(tiny_model_dir), make_task(cfg.task), params, 4, seed=3)
    sampler.load_weights(4, v4)
    groups = sampler.generate_groups(16)
    return params, versions, groups, tiny_model_dir


def verifier(setup, fraction: float = 1.0, tol: Tolerances = TOL) -> RolloutVerifier:
    params, versions, _, model_dir = setup
    return RolloutVerifier(Policy.load(model_dir), params, versions.__getitem__, tol, fraction, b"k")


def test_honest_groups_are_recomputed_exactly_and_pass(setup) -> None:
    v = verifier(setup)
    for group in setup[2]:
        logp, _ = v.rescore(group)
        mask = group.completion_mask_GL.bool()
        assert float((logp[mask] - group.behavior_logp_GL[mask]).abs().max()) < 1e-5  # float rounding only
        assert v.check(group).ok
    assert (v.checked, v.failed) == (16, 0)


@pytest.mark.parametrize("delta", [-0.01, 0.2, -1.0])
def test_shifted_log_probs_are_a_mismatch(setup, delta: float) -> None:
    v = verifier(setup)
    group = copy.deepcopy(setup[2][0])
    mask = group.completion_mask_GL.bool()
    group.behavior_logp_GL = torch.where(mask, (group.behavior_logp_GL + delta).clamp(max=0), 0.0)
    result = v.check(group)
    assert result.reason == "logprob_mismatch"
    assert result.mean_abs > TOL.mean


def test_a_claimed_version_that_did_not_produce_the_tokens_is_caught(setup) -> None:
    """Generated with version 4, claimed as version 3 (a sampler hiding its staleness, or another model)."""
    v = verifier(setup)
    caught = 0
    for group in setup[2]:
        lie = copy.deepcopy(group)
        lie.version_GL = torch.full_like(lie.version_GL, 3)
        caught += v.check(lie).reason == "logprob_mismatch"
    assert caught == 16


def test_an_impossible_token_under_top_k_is_a_mismatch(setup) -> None:
    params, versions, groups, model_dir = setup
    top1 = SamplingParams(params.temperature, 1, params.top_p, params.max_new_tokens)
    v = RolloutVerifier(Policy.load(model_dir), top1, versions.__getitem__, TOL, 1.0, b"k")
    results = [v.check(g) for g in groups]
    assert any(r.reason == "logprob_mismatch" and "impossible" in r.detail for r in results)


def test_a_version_that_cannot_be_rebuilt_is_unverifiable_not_refused(setup) -> None:
    v = verifier(setup)
    group = copy.deepcopy(setup[2][0])
    group.version_GL = torch.full_like(group.version_GL, 99)
    result = v.check(group)
    assert (result.reason, v.unverifiable, v.checked) == ("unverifiable", 1, 0)


def test_pit_by_hand() -> None:
    logp = torch.tensor([[[0.5, 0.3, 0.2], [0.4, 0.3, 0.3]]]).log()  # [N=1, L=2, V=3]
    tokens = torch.tensor([[1, 2]])
    noise = torch.tensor([[0.5, 0.25]])
    u = pit(logp, tokens, noise)
    # token 1 of [.5 .3 .2]: 0.5 above it, then a quarter... half of its own 0.3: 0.5 + 0.5 * 0.3 = 0.65
    # token 2 of [.4 .3 .3]: 0.4 above, its tie block is 0.6 (two tokens of 0.3): 0.4 + 0.25 * 0.6 = 0.55
    assert torch.allclose(u, torch.tensor([[0.65, 0.55]]), atol=1e-6)


def test_pit_is_uniform_under_honest_sampling() -> None:
    """Tokens drawn from peaked and flat distributions: the u are U(0, 1) (mean 1/2, variance 1/12)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 50, 40, generator=gen) * torch.tensor([0.1, 3.0, 10.0]).repeat(22)[:64, None, None]
    logp = torch.log_softmax(logits, -1)
    tokens = torch.multinomial(logp.exp().view(-1, 40), 1, generator=gen).view(64, 50)
    u = pit(logp, tokens, torch.rand(64, 50, generator=gen)).flatten().double()
    n = u.numel()
    assert abs(float(u.mean()) - 0.5) < 4 / math.sqrt(12 * n)
    assert abs(float(u.var()) - 1 / 12) < 0.005
    hist = torch.histc(u.float(), bins=10, min=0, max=1) / n
    assert float((hist - 0.1).abs().max()) < 0.015


def test_the_calibration_test_catches_greedy_completions_re_scored_honestly(setup) -> None:
    """Another model's tokens (here the claimed model's own greedy ones) with the claimed version's true log-probs:
    check 1 passes, the u pile up near 0 and z fails."""
    params, versions, groups, model_dir = setup
    v = verifier(setup)
    policy = Policy.load(model_dir)
    for name, p in policy.model.named_parameters():
        p.data.copy_(versions[4][name])
    group = copy.deepcopy(groups[0])
    prompts = policy.encode_prompts([g.prompt for g in groups[:1]])
    greedy = SamplingParams(greedy=True, max_new_tokens=params.max_new_tokens)
    gen = policy.generate(*[t.repeat(4, 1) for t in prompts], greedy, version=4)
    group.completion_ids_GL, group.completion_mask_GL = gen.completion_ids_NL, gen.completion_mask_NL
    group.version_GL = gen.version_NL
    group.behavior_logp_GL = v.rescore(group)[0]
    result = judge(group, *v.rescore(group), TOL)
    assert result.mean_abs == 0.0
    assert result.z < 0  # greedy tokens are the likeliest: u near 0
    pooled = [judge(g, *v.rescore(g), TOL) for g in groups]
    assert all(abs(r.z) < TOL.z for r in pooled)


def test_selection_is_keyed_by_content_and_near_the_fraction(setup) -> None:
    messages = [f"tokens {i}".encode() for i in range(4000)]
    picked = [uniform_key(b"k", m, b"select") < 0.1 * 2.0**64 for m in messages]
    assert 0.085 < sum(picked) / len(messages) < 0.115
    other = [uniform_key(b"other key", m, b"select") < 0.1 * 2.0**64 for m in messages]
    assert picked != other  # a sampler without the key cannot tell which groups will be checked
    v = verifier(setup, fraction=0.5)
    groups = setup[2]
    chosen = [v.selected(g) for g in groups]
    assert chosen == [uniform_key(b"k", content(g), b"select") < 0.5 * 2.0**64 for g in groups]
    renamed = [copy.deepcopy(g) for g in groups]
    for g in renamed:
        g.group_id += "@another-boot"  # a live sampler's ids carry its boot id: the choice does not depend on it
    assert [v.selected(g) for g in renamed] == chosen


def test_the_screens_shared_rows_give_the_same_content_choice_noise_and_fingerprint(setup) -> None:
    """The screen computes a group's id rows once and hands them to the fingerprint, `content`, `selected` and the
    re-score: each must be what it computes on its own (a stale or other group's rows would pick, seed or
    fingerprint another group)."""
    from heterorl.loop.screen import fingerprint

    v = verifier(setup, fraction=0.5)
    groups = setup[2]
    for group in groups[:6]:
        rows = group.row_bytes(group.completion_ids_GL)
        tokens = content(group, rows)
        assert tokens == content(group)
        assert fingerprint(group, rows) == fingerprint(group)
        assert v.selected(group, tokens) == v.selected(group)
        for got, want in zip(v.rescore(group, tokens), v.rescore(group), strict=True):
            assert torch.equal(got, want)
    assert content(groups[0]) != content(groups[1])


def test_the_re_score_under_inference_mode_is_the_no_grad_one(setup, monkeypatch) -> None:
    """The verifier's forward runs under inference mode: the same log-probs and u as under no_grad, returned as
    ordinary tensors."""
    v = verifier(setup)
    group = setup[2][0]
    got = v.rescore(group)
    monkeypatch.setattr(torch, "inference_mode", torch.no_grad)
    for a, b in zip(got, v.rescore(group), strict=True):
        assert torch.equal(a, b)
        assert not a.is_inference()
