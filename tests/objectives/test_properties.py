"""Properties every objective shares, with and without its options: stats keys, padding, equal rewards, on-policy
equivalence to PG."""

import math
from pathlib import Path

import pytest
import torch

from heterorl.config import OBJECTIVE_CONFIGS
from heterorl.objectives import (
    CLIP_STAT_KEYS,
    COMMON_STAT_KEYS,
    GATE_STAT_KEYS,
    WEIGHT_STAT_KEYS,
    group_advantages,
    make_objective,
)

NAMES = sorted(OBJECTIVE_CONFIGS)
REQUIRED = {
    "grpo": CLIP_STAT_KEYS,
    "gspo": CLIP_STAT_KEYS,
    "gepo": (*CLIP_STAT_KEYS, "gepo_kl"),
    "dg": GATE_STAT_KEYS,
    "decoupled_ppo": (*CLIP_STAT_KEYS, "cap_frac"),
    "cispo": CLIP_STAT_KEYS,
    "pg": (),
    "is_pg": CLIP_STAT_KEYS,
}
CAP_STAT_KEYS = ("cap_frac", "cap_frac_low", "cap_frac_high")
# Every objective at its defaults, and with each of its options (caps at every level and mode, dual clip, the
# reference KL with every estimator).
VARIANTS = [(name, {}) for name in NAMES] + [
    ("grpo", {"cap_mode": "clamp"}),
    ("grpo", {"cap_mode": "mask", "cap_level": "sequence", "cap": 1.5}),
    ("grpo", {"dual_clip": 1.5, "ref_kl_beta": 0.1, "aggregation": "token_mean"}),
    ("gspo", {"cap_mode": "clamp", "cap": 1.2}),
    ("gspo", {"cap_mode": "mask", "cap_level": "geometric", "cap": 1.1, "ref_kl_beta": 0.1}),
    ("gepo", {"cap_mode": "mask", "cap": 1.3, "switch": True, "kl_beta": 0.01}),
    ("gepo", {"cap_mode": "clamp", "cap_level": "sequence", "defensive_lam": 0.2}),
    ("decoupled_ppo", {"cap_mode": "mask", "cap_level": "geometric", "cap_low": None, "cap": 1.1, "dual_clip": 1.5}),
    ("cispo", {"cap_mode": "clamp", "eps_high": 0.2, "ref_kl_beta": 0.1, "ref_kl_estimator": "k2"}),
    ("cispo", {"cap_mode": "mask", "cap_level": "sequence", "cap": 1.5}),
    ("pg", {"ref_kl_beta": 0.1, "ref_kl_estimator": "k1"}),
    ("dg", {"ref_kl_beta": 0.1, "aggregation": "dr_grpo"}),
]


def variant_id(variant: tuple[str, dict]) -> str:
    name, hp = variant
    return "-".join([name, *(f"{k}={v}" for k, v in hp.items())])


def required_keys(name: str, hp: dict) -> tuple[str, ...]:
    keys = (*COMMON_STAT_KEYS, *WEIGHT_STAT_KEYS, *REQUIRED[name])
    if hp.get("cap_mode", "mask" if name == "decoupled_ppo" else "none") != "none":
        keys = (*keys, *CAP_STAT_KEYS)
    if "dual_clip" in hp:
        keys = (*keys, "dual_clip_frac")
    if hp.get("ref_kl_beta", 0) > 0:
        keys = (*keys, "kl_ref")
    return keys


B, T = 6, 5
GROUPS = torch.tensor([4, 4, 4, 9, 9, 9])


def make_batch(seed: int = 0, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[:, 0] = False  # a prompt token
    mask[1, 3:] = False  # padding
    mask[5, 2:] = False
    return {
        "logp": logp,
        "behavior_logp": logp + 0.3 * torch.randn(B, T, generator=g, dtype=dtype),
        "prox_logp": logp + 0.1 * torch.randn(B, T, generator=g, dtype=dtype),
        "ref_logp": logp + 0.2 * torch.randn(B, T, generator=g, dtype=dtype),
        "mask": mask,
        "advantages": torch.randn(B, generator=g, dtype=dtype),
        "group_index": GROUPS,
    }


def loss_and_grad(name: str, batch: dict[str, torch.Tensor], **hp) -> tuple[torch.Tensor, torch.Tensor, dict]:
    logp = batch["logp"].clone().requires_grad_()
    out = make_objective(name, **hp)(**{**batch, "logp": logp})
    (grad,) = torch.autograd.grad(out.loss, logp)
    return out.loss.detach(), grad, out.stats


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
def test_every_objective_reports_the_required_stats(variant: tuple[str, dict]):
    name, hp = variant
    _, _, stats = loss_and_grad(name, make_batch(dtype=torch.float32), **hp)
    for key in required_keys(name, hp):
        assert key in stats, key
    assert all(type(v) is float and math.isfinite(v) for v in stats.values()), stats


@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
@pytest.mark.parametrize("garbage", [math.nan, math.inf, -math.inf, 50.0, -1e30])
def test_padding_contributes_nothing(variant: tuple[str, dict], garbage: float):
    name, hp = variant
    batch = make_batch()
    off = ~batch["mask"]
    dirty = {k: torch.where(off, garbage, v) if k.endswith("logp") else v for k, v in batch.items()}
    loss, grad, stats = loss_and_grad(name, batch, **hp)
    loss_d, grad_d, stats_d = loss_and_grad(name, dirty, **hp)
    torch.testing.assert_close(loss_d, loss)
    torch.testing.assert_close(grad_d, grad)
    assert (grad_d[off] == 0).all()
    assert stats_d == pytest.approx(stats)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v[0] != "dg" and v[1].get("aggregation") != "dr_grpo"])
def test_padding_equals_truncated_batch(variant: tuple[str, dict]):
    """Cutting the padded tail off the tensors changes nothing (for the length-independent aggregations)."""
    name, hp = variant
    batch = make_batch()
    batch["mask"][:, 4:] = False
    short = {k: v[:, :4] if v.dim() == 2 else v for k, v in batch.items()}
    loss, grad, _ = loss_and_grad(name, batch, **hp)
    loss_s, grad_s, _ = loss_and_grad(name, short, **hp)
    torch.testing.assert_close(loss_s, loss)
    torch.testing.assert_close(grad_s, grad[:, :4])


@pytest.mark.parametrize(
    "variant", [v for v in VARIANTS if not v[1].get("ref_kl_beta") and not v[1].get("kl_beta")], ids=variant_id
)
def test_equal_rewards_give_zero_loss_and_gradient(variant: tuple[str, dict]):
    name, hp = variant
    batch = make_batch()
    obj = make_objective(name, **hp)
    rewards = torch.tensor([0.7, 0.7, 0.7, 0.3, 0.3, 0.3], dtype=torch.float64)
    batch["advantages"] = group_advantages(rewards, GROUPS, normalize=obj.normalize_advantages)
    loss, grad, stats = loss_and_grad(name, batch, **hp)
    assert loss.item() == 0.0
    assert (grad == 0).all()
    assert stats["advantage_abs_mean"] == 0.0


ON_POLICY = [
    ("grpo", {"aggregation": "seq_mean_token_mean"}, "seq_mean_token_mean"),
    ("grpo", {"aggregation": "token_mean"}, "token_mean"),
    ("grpo", {"aggregation": "dr_grpo", "eps_low": 0.0, "eps_high": 0.0}, "dr_grpo"),
    ("gspo", {}, "seq_mean_token_mean"),
    ("decoupled_ppo", {}, "token_mean"),
    ("decoupled_ppo", {"cap_mode": "clamp", "aggregation": "seq_mean_token_mean"}, "seq_mean_token_mean"),
    ("is_pg", {"aggregation": "dr_grpo"}, "dr_grpo"),
    ("cispo", {}, "token_mean"),
    ("cispo", {"cap_mode": "mask", "cap_level": "sequence", "eps_low": 0.2, "eps_high": 0.2}, "token_mean"),
    ("grpo", {"cap_mode": "clamp", "dual_clip": 3.0}, "seq_mean_token_mean"),
    ("grpo", {"cap_mode": "mask", "cap_level": "sequence", "aggregation": "token_mean"}, "token_mean"),
    ("gspo", {"cap_mode": "mask", "cap_level": "geometric"}, "seq_mean_token_mean"),
    ("gspo", {"cap_mode": "clamp", "cap_level": "token"}, "seq_mean_token_mean"),
    ("decoupled_ppo", {"cap_level": "sequence", "cap_low": None, "dual_clip": 2.0}, "token_mean"),
]


@pytest.mark.parametrize(("name", "hp", "aggregation"), ON_POLICY)
def test_on_policy_gradient_equals_pg(name: str, hp: dict, aggregation: str):
    """behaviour = prox = current policy: every ratio is 1 with gradient grad log p, so the clip is inactive."""
    batch = make_batch()
    batch["behavior_logp"] = batch["prox_logp"] = batch["logp"]
    _, grad, stats = loss_and_grad(name, batch, **hp)
    _, grad_pg, _ = loss_and_grad("pg", batch, aggregation=aggregation)
    torch.testing.assert_close(grad, grad_pg)
    assert stats["kl_k3"] == 0.0
    assert stats["is_weight_mean"] == pytest.approx(1.0)
    assert stats["ess"] == pytest.approx(1.0)
    assert stats.get("clip_frac", 0.0) == 0.0


def test_every_stat_key_is_documented():
    """docs/objectives.md's stats table defines every key an objective (or the learner, for truncation) reports."""
    table = (Path(__file__).resolve().parents[2] / "docs" / "objectives.md").read_text()
    keys = {"truncated_frac", "overlong_penalty_mean"}  # the learner's, logged under obj/ with the objective's
    for name, hp in VARIANTS:
        keys |= set(loss_and_grad(name, make_batch(), **hp)[2])
    assert sorted(k for k in keys if f"| `{k}` |" not in table) == []
