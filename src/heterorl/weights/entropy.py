"""Entropy bounds of a weight step: what coding its change positions and value deltas must cost, per context.

A patch tells the receiver, for every element, whether its bits changed (position information) and, for the
changed ones, the wrapped bit difference d = new - base (value information). For a context c known to the
receiver (it holds the base, verified by hash), the empirical conditional entropies are

    positions:  H_pos(c) = sum over tensors t, context values v of  n_tv * h(k_tv / n_tv)
    values:     H_val(c) = sum over t, v of  k_tv * H(d | t, v)    (empirical entropy of the d's in the cell)

with n_tv elements and k_tv changes in the cell and h the binary entropy. Context "tensor" (one cell per tensor)
is the independent-position bound: any coder treating a tensor's change positions as exchangeable pays at least
H_pos(tensor). Fine contexts (a row, a column) have few elements per cell, so their empirical entropy flatters
them; `kt_bits` gives the adaptive code length (Krichevsky-Trofimov estimator per cell, learning cost included),
which a real coder can reach, so contexts are compared on that. Contexts are computed from the base alone:

* exponent: the float's biased exponent field (bf16/fp32: 8 bits, fp16: 5 bits): one ULP is 2^(e - mantissa
  bits), so a step of size s changes an element with probability ~ s / ULP;
* sign_exponent: sign and exponent (weight decay pulls magnitudes down, i.e. the bit difference negative);
* mantissa_edge: exponent plus whether the mantissa is all zeros or all ones (rounding intervals are uneven at a
  binade edge);
* row / column of the tensor viewed as 2-D (rows x rest), e.g. a token's embedding row;
* prev_changed: whether the previous element in C order changed (clustering; sequential decoders only).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

import numpy as np
import torch

from heterorl.weights.format import StateDict, bits_view

MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52}
EXPONENT_BITS = {torch.bfloat16: 8, torch.float16: 5, torch.float32: 8, torch.float64: 11}
_LN2 = math.log(2.0)


def h_bits(k: np.ndarray, n: np.ndarray) -> float:
    """sum n * h(k / n) in bits over cells (k changes among n elements)."""
    k = np.asarray(k, np.float64)
    n = np.asarray(n, np.float64)
    ok = (k > 0) & (k < n)
    k, n = k[ok], n[ok]
    return float(-(k * np.log2(k / n) + (n - k) * np.log2((n - k) / n)).sum())


def kt_bits(k: np.ndarray, n: np.ndarray) -> float:
    """Adaptive code length (bits) of each cell's flags under the Krichevsky-Trofimov estimator, summed.

    -log2 P_KT = -log2[ Gamma(k + 1/2) Gamma(n - k + 1/2) / (pi Gamma(n + 1)) ]: the empirical entropy plus
    ~log2(n)/2 + 1 bits of learning cost per cell, and achievable by an adaptive binary coder.
    """
    k = np.asarray(k, np.float64)
    n = np.asarray(n, np.float64)
    n_, k_ = n[n > 0], k[n > 0]
    n_t, k_t = torch.from_numpy(n_), torch.from_numpy(k_)
    nats = torch.lgamma(n_t + 1) - torch.lgamma(k_t + 0.5) - torch.lgamma(n_t - k_t + 0.5)
    return float((nats.sum().item() + math.log(math.pi) * n_.size) / _LN2)


def symbol_entropy_bits(symbols: np.ndarray, cells: np.ndarray | None = None) -> float:
    """sum over cells of count * empirical entropy of `symbols` within the cell (bits); one cell if None."""
    if symbols.size == 0:
        return 0.0
    _, sym = np.unique(symbols, return_inverse=True)
    if cells is None:
        counts = np.bincount(sym)
        joint, marginal = counts, np.array([symbols.size])
    else:
        _, cell = np.unique(cells, return_inverse=True)
        joint = np.bincount(cell * (sym.max() + 1) + sym)
        marginal = np.bincount(cell)
    joint = joint[joint > 0].astype(np.float64)
    marginal = marginal[marginal > 0].astype(np.float64)
    return float((marginal * np.log2(marginal)).sum() - (joint * np.log2(joint)).sum())


def exponent_field(bits_U: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Biased exponent of each element (int64); integer dtypes get their top byte as a stand-in."""
    if dtype in MANTISSA_BITS:
        return ((bits_U >> MANTISSA_BITS[dtype]) & ((1 << EXPONENT_BITS[dtype]) - 1)).astype(np.int64)
    return (bits_U >> (8 * bits_U.itemsize - 8)).astype(np.int64)


def contexts(
    bits_U: np.ndarray, changed_N: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...]
) -> Iterator[tuple[str, np.ndarray]]:
    """(name, non-negative int64 context id per element) for every candidate context of the module docstring,
    one at a time (each is 8 bytes per element)."""
    n = bits_U.size
    exponent = exponent_field(bits_U, dtype)
    yield "tensor", np.zeros(n, np.int64)
    yield "exponent", exponent
    yield "sign_exponent", (bits_U >> (8 * bits_U.itemsize - 1)).astype(np.int64) * 4096 + exponent
    if dtype in MANTISSA_BITS:
        mant = bits_U & ((1 << MANTISSA_BITS[dtype]) - 1)
        edge = np.where(mant == 0, 1, np.where(mant == (1 << MANTISSA_BITS[dtype]) - 1, 2, 0))
        yield "mantissa_edge", exponent * 3 + edge
        del mant, edge
    cols = max(1, math.prod(shape[1:])) if len(shape) > 1 else max(1, n)
    rows = np.arange(n, dtype=np.int64) // cols
    yield "row", rows
    yield "exponent_row", exponent * (int(rows.max(initial=0)) + 1) + rows
    del rows
    yield "column", np.arange(n, dtype=np.int64) % cols
    prev = np.zeros(n, np.int64)
    prev[1:] = changed_N[:-1]
    yield "prev_changed", prev


def step_entropy(base: StateDict, new: StateDict, names: tuple[str, ...] | None = None) -> dict[str, dict[str, float]]:
    """Bits to code the step base -> new under each context: {context: {pos_h, pos_kt, val_h}}, plus totals.

    Position bits per context are the empirical entropy (`pos_h`) and the adaptive KT code length (`pos_kt`);
    value bits (`val_h`) are the empirical conditional entropy of the wrapped differences (value contexts that
    are unique per element, like row, are skipped: every single symbol would look free).
    """
    result: dict[str, dict[str, float]] = {}
    changed_total = 0
    for name in sorted(base):
        b, n = base[name], new[name]
        bits_b, bits_n = bits_view(b), bits_view(n)
        changed_N = bits_b != bits_n
        k = int(changed_N.sum())
        changed_total += k
        if k == 0:
            continue
        delta = (bits_n[changed_N] - bits_b[changed_N]).astype(np.int64)
        for ctx, ids in contexts(bits_b, changed_N, b.dtype, tuple(b.shape)):
            if names is not None and ctx not in names:
                continue
            n_c = np.bincount(ids)
            k_c = np.bincount(ids[changed_N], minlength=n_c.size)
            entry = result.setdefault(ctx, {"pos_h": 0.0, "pos_kt": 0.0, "val_h": 0.0})
            entry["pos_h"] += h_bits(k_c, n_c)
            entry["pos_kt"] += kt_bits(k_c, n_c)
            value_cells = None if ctx == "tensor" else ids[changed_N]
            if ctx in ("row", "column", "exponent_row"):
                value_cells = None  # too fine for values (see docstring); report the tensor-level figure
            entry["val_h"] += symbol_entropy_bits(delta, value_cells)
    result["_totals"] = {"changed": float(changed_total), "numel": float(sum(t.numel() for t in base.values()))}
    return result


def bounds(base: StateDict, new: StateDict) -> dict[str, float]:
    """The two bounds `sync bench` prints, in bits: independent positions (context "tensor") and
    exponent-conditioned positions and values (context "exponent"); `changed` elements for per-element figures."""
    e = step_entropy(base, new, names=("tensor", "exponent"))
    if "tensor" not in e:
        return {"independent_bits": 0.0, "exponent_bits": 0.0, "changed": 0.0}
    return {
        "independent_bits": e["tensor"]["pos_h"] + e["tensor"]["val_h"],
        "exponent_bits": e["exponent"]["pos_h"] + e["exponent"]["val_h"],
        "changed": e["_totals"]["changed"],
    }


def format_table(entropy: Mapping[str, Mapping[str, float]]) -> str:
    """Bits per changed element by context: positions (empirical, KT) and values."""
    changed = max(1.0, entropy["_totals"]["changed"])
    lines = [f"{'context':16s} {'pos H':>8s} {'pos KT':>8s} {'val H':>8s} {'H total':>8s}  (bits / changed element)"]
    for ctx, e in entropy.items():
        if ctx.startswith("_"):
            continue
        pos, kt, val = e["pos_h"] / changed, e["pos_kt"] / changed, e["val_h"] / changed
        lines.append(f"{ctx:16s} {pos:8.3f} {kt:8.3f} {val:8.3f} {pos + val:8.3f}")
    return "\n".join(lines)
