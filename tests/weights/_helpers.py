"""Shared builders for weight-sync tests: random raw-bit tensors, normal weights, mutations, comparisons."""

from __future__ import annotations

import numpy as np
import torch

from heterorl.weights.format import bits_view

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def random_bits(shape: tuple[int, ...], dtype: torch.dtype, rng: np.random.Generator) -> torch.Tensor:
    """Tensor whose raw bits are uniform: covers NaNs (many payloads), infs, subnormals, -0.0."""
    t = torch.empty(shape, dtype=dtype)
    view = bits_view(t)
    view[...] = rng.integers(0, np.iinfo(view.dtype).max, size=view.size, dtype=view.dtype, endpoint=True)
    return t


def normal_weights(shape: tuple[int, ...], dtype: torch.dtype, rng: np.random.Generator) -> torch.Tensor:
    return torch.from_numpy(rng.normal(0.0, 0.02, size=shape).astype(np.float32)).to(dtype)


def mutate(t: torch.Tensor, rate: float, rng: np.random.Generator, mode: str = "mixed") -> torch.Tensor:
    """Copy of t with ~rate of its elements changed: +-1 ULP in the bits, random bits, or both."""
    out = t.clone()
    view = bits_view(out)
    chosen = np.flatnonzero(rng.random(view.size) < rate)
    step = rng.choice(np.array([1, np.iinfo(view.dtype).max], view.dtype), chosen.size)  # +1 or -1 mod 2^w
    random = rng.integers(0, np.iinfo(view.dtype).max, chosen.size, dtype=view.dtype, endpoint=True)
    if mode == "ulp":
        view[chosen] = view[chosen] + step
    elif mode == "random":
        view[chosen] = random
    else:
        view[chosen] = np.where(rng.random(chosen.size) < 0.8, view[chosen] + step, random)
    return out


def clone(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in weights.items()}


def bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Bit-for-bit equality (float == would call NaN != NaN and -0.0 == 0.0)."""
    return sorted(a) == sorted(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(bits_view(a[k]), bits_view(b[k]))
        for k in a
    )
