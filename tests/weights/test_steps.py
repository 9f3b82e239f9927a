"""Step generators: shapes, dtypes, change rates, real optimizer steps, the cache."""

from __future__ import annotations

import pytest
import torch

from heterorl.bench.steps import noise_step, num_params, procedural_tokens, qwen3_versions, step_pair
from heterorl.weights.format import bits_view

from ._helpers import bits_equal


def changed_share(base: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> float:
    changed = sum(int((bits_view(base[k]) != bits_view(new[k])).sum()) for k in base)
    return changed / num_params(base)


def test_noise_step_changes_more_with_a_larger_lr():
    small, large = noise_step(300_000, 1e-6, seed=1), noise_step(300_000, 1e-5, seed=1)
    assert all(t.dtype == torch.bfloat16 for t in small[0].values())
    assert bits_equal(small[0], large[0])  # same masters
    assert 0.005 < changed_share(*small) < 0.1
    assert changed_share(*small) * 3 < changed_share(*large) < 0.5


def test_procedural_tokens_cover_the_vocabulary_range():
    ids = procedural_tokens(8, 64, 1000, torch.Generator().manual_seed(0))
    assert ids.shape == (8, 64)
    assert int(ids.min()) >= 0
    assert int(ids.max()) < 1000
    assert len(ids.unique()) > 30


def test_qwen3_versions_are_real_adamw_steps_and_cached():
    kw = {"hidden": 64, "layers": 1, "vocab": 512, "batch": 2, "length": 16}
    versions = qwen3_versions(2, 1e-3, **kw)
    assert len(versions) == 3
    first = versions[0]
    assert "lm_head.weight" not in first  # tied to the embedding, sent once
    assert all(t.dtype == torch.bfloat16 for t in first.values())
    assert 0.1 < changed_share(versions[0], versions[1]) < 1.0
    again = qwen3_versions(2, 1e-3, **kw)  # from the cache
    assert all(bits_equal(a, b) for a, b in zip(versions, again, strict=True))


def test_step_pair_dispatch():
    base, new = step_pair("synthetic", 200_000, change_rate=0.02)
    assert 0.015 < changed_share(base, new) < 0.025
    with pytest.raises(ValueError, match="unknown step kind"):
        step_pair("nope")
