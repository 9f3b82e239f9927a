"""Magnitude classes: the context that PULSE v2 codes change positions and values in.

Whether an optimizer step changes a bf16 weight depends on its magnitude: one ULP is 2^(e - 7) for exponent e,
so a step of size s changes it with probability ~ s / ULP, twice as likely per octave further down; measured
on real AdamW steps every octave below the bulk holds about the same number of changes while the octave's
population halves (docs/weight-sync.md, "Entropy"). The receiver holds the base bits, so it can sort elements
into classes by magnitude |bits| (sign bit cleared) without being told anything but the class bounds:

    class c = { i : T_c <= |bits_i| < T_(c+1) },  T_0 = 0 < T_1 < ... < T_(K-1),  T_K = infinity

and code each class's changes with its own statistics. The top class ("rest": the large weights, most of the
tensor, the lowest change rate) is coded in flat positions; the classes below it are coded by rank among
their own members, which needs their positions: `members` enumerates them level by level from the bottom of
the top bound down, so the work is proportional to the small-weight set, not to K times the tensor.

`choose_bounds` picks K and the bounds per tensor by dynamic programming over exponent bins, minimising the
empirical entropy of positions and values (estimated from a sample of the base and all changed elements) plus
a fixed header cost per class.
"""

from __future__ import annotations

import functools
import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23, torch.float64: 52}
MAX_CLASSES = 16
CLASS_COST_BITS = 320.0  # header entry + zstd block overhead of one more class, measured (~40 bytes)
SPLIT_COST_BITS = 0.05  # charged per element of a set the decoder splits to separate a class (decode time)
_SAMPLE = 1 << 16  # base elements looked at when estimating class sizes
_VALUE_BINS = 64  # value codes >= this share one bin in the entropy estimate


def magnitude_mask(dtype: torch.dtype) -> int | None:
    """Mask clearing the sign bit of a float's bits (None for dtypes without magnitude classes)."""
    if dtype not in MANTISSA_BITS:
        return None
    return (1 << (8 * dtype.itemsize - 1)) - 1


def magnitudes(bits_U: np.ndarray, mask: int) -> np.ndarray:
    """|bits| (sign cleared), same unsigned dtype."""
    return np.bitwise_and(bits_U, bits_U.dtype.type(mask))


_STEP = 1 << 15  # 64-bit words per step of the 16-bit scan (128 K elements): its temporaries stay in L2
_LANES = 0x0001000100010001  # one in each 16-bit lane of a 64-bit word
_LOW15 = np.uint64(0x7FFF * _LANES)
_HIGH1 = np.uint64(0x8000 * _LANES)


def select_below(bits_U: np.ndarray, bound: int, mask: int) -> np.ndarray:
    """Sorted positions (int64) of the elements with |bits| = bits & mask < bound.

    16-bit floats are scanned four to a 64-bit word (SWAR): per lane, (|x| + 0x8000 - bound) sets the lane's
    top bit iff |x| >= bound, with no carry between lanes (both terms are < 0x8000); only words with a clear
    lane are looked at element by element. `np.flatnonzero` costs ~1 ns per element scanned whatever the
    density, so scanning words instead of elements is what makes this ~2x faster than `|x| < bound` per element.
    """
    n = bits_U.size
    head = n - n % 4 if bits_U.itemsize == 2 and mask == 0x7FFF else 0
    parts = [_select_below16(bits_U[:head], bound)] if head else []
    tail = bits_U[head:]
    parts.append(np.flatnonzero(np.bitwise_and(tail, tail.dtype.type(mask)) < tail.dtype.type(bound)) + head)
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _select_below16(bits_U: np.ndarray, bound: int) -> np.ndarray:
    words = bits_U.view(np.uint64)
    offset = np.uint64((0x8000 - bound) * _LANES)
    step = min(_STEP, words.size)
    y_W = np.empty(step, np.uint64)
    small_W = np.empty(step, np.bool_)
    out = []
    for start in range(0, words.size, step):
        chunk = words[start : start + step]
        y, small = y_W[: chunk.size], small_W[: chunk.size]
        np.bitwise_and(chunk, _LOW15, out=y)
        y += offset
        y &= _HIGH1
        np.not_equal(y, _HIGH1, out=small)  # a word with at least one lane below the bound
        cand = np.flatnonzero(small)
        lanes = np.take(y, cand).view(np.uint16)  # [4 * candidates]: 0 where the lane is below the bound
        j = np.flatnonzero(lanes == 0)
        pos = np.take(cand, j >> 2)
        pos += start
        pos <<= 2
        pos += j & 3
        out.append(pos)
    return np.concatenate(out)


class Members:
    """The members of one class below the top, in position order: positions pos_R[idx] (all of pos_R if idx is
    None). Kept as an index into the level set so that a sparsely changed class never gathers all of them.
    `changed` (encoder only): per member, whether it changed."""

    def __init__(self, pos_R: np.ndarray, idx: np.ndarray | None = None, changed: np.ndarray | None = None) -> None:
        self.pos_R = pos_R
        self.idx = idx
        self.changed = changed

    @property
    def size(self) -> int:
        return int(self.pos_R.size if self.idx is None else self.idx.size)

    def at(self, ranks: np.ndarray) -> np.ndarray:
        """Positions of the members with these ranks (each < size)."""
        return np.take(self.pos_R, ranks if self.idx is None else np.take(self.idx, ranks))


PARALLEL_MIN = 1 << 22  # elements: a tensor this large is enumerated in `workers` position ranges at once


def members(
    bits_U: np.ndarray,
    mask: int,
    bounds: list[int],
    changed_N: np.ndarray | None = None,
    workers: int = 1,
) -> list[Members]:
    """The members of every class below the top one (classes 0 .. K-2), each in position order.

    One scan of the tensor finds the set below the top bound (`select_below`); each further level splits the
    remaining set at the next bound down, so the cost is ~2 passes over the small-weight set. With `changed_N`
    (a bool per element) every class also gets its members' changed flags, split along with the positions.
    With `workers` > 1 a large tensor is cut into that many position ranges enumerated in threads (numpy
    releases the GIL) and the per-class lists are concatenated, which keeps them in position order.
    """
    if not bounds:
        return []
    n = bits_U.size
    if workers <= 1 or n < PARALLEL_MIN:
        return _members(bits_U, mask, bounds, changed_N)
    cuts = [min(n, (n * i // workers) & ~3) for i in range(workers)] + [n]
    ranges = list(itertools.pairwise(cuts))

    def one(r: tuple[int, int]) -> list[Members]:
        lo, hi = r
        return _members(bits_U[lo:hi], mask, bounds, None if changed_N is None else changed_N[lo:hi])

    with ThreadPoolExecutor(workers) as pool:
        parts = list(pool.map(one, ranges))
    out = []
    for c in range(len(bounds)):
        positions = [m[c].at(np.arange(m[c].size)) + lo for m, (lo, _) in zip(parts, ranges, strict=True)]
        flags = None if changed_N is None else np.concatenate([m[c].changed for m in parts])  # type: ignore[misc]
        out.append(Members(np.concatenate(positions), None, flags))
    return out


def _members(bits_U: np.ndarray, mask: int, bounds: list[int], changed_N: np.ndarray | None) -> list[Members]:
    dtype = bits_U.dtype.type
    pos_S = select_below(bits_U, bounds[-1], mask)
    mag_S = np.take(bits_U, pos_S)
    mag_S &= dtype(mask)
    flags_S = None if changed_N is None else np.take(changed_N, pos_S)
    out: list[Members] = []
    for c in range(len(bounds) - 1, 0, -1):
        below = mag_S < dtype(bounds[c - 1])
        inner = np.flatnonzero(below)
        np.logical_not(below, out=below)
        outer = np.flatnonzero(below)
        out.append(Members(pos_S, outer, None if flags_S is None else np.take(flags_S, outer)))
        pos_S = np.take(pos_S, inner)
        mag_S = np.take(mag_S, inner)
        flags_S = None if flags_S is None else np.take(flags_S, inner)
    out.append(Members(pos_S, None, flags_S))
    return out[::-1]


def class_flags_torch(base_I: torch.Tensor, mask: int, bounds: list[int], pos_K: np.ndarray) -> list[np.ndarray]:
    """Per class below the top, its members' changed flags in position order (host bool arrays), computed with
    torch ops on the device where the base lives (the same level-by-level split as `members`)."""
    device = base_I.device
    changed = torch.zeros(base_I.numel(), dtype=torch.bool, device=device)
    changed[torch.from_numpy(pos_K).to(device)] = True
    mag = base_I & mask
    below_top = torch.nonzero(mag < bounds[-1]).reshape(-1)
    mag_S, flags_S = mag[below_top], changed[below_top]
    out = []
    for c in range(len(bounds) - 1, 0, -1):
        below = mag_S < bounds[c - 1]
        out.append(flags_S[~below])
        mag_S, flags_S = mag_S[below], flags_S[below]
    out.append(flags_S)
    return [flags.cpu().numpy() for flags in out[::-1]]


def sample_stride(n: int) -> int:
    """Stride of the evenly strided sample of a tensor that `choose_bounds` estimates class sizes from."""
    return max(1, n // _SAMPLE)


def exponent_bin_count(mask: int, shift: int) -> int:
    """Exponent bins of a dtype's magnitudes (bits & mask) >> shift: 256 for bf16 and float32."""
    return (mask >> shift) + 1


def histograms(
    sample_mag: np.ndarray, mag_K: np.ndarray, codes_K: np.ndarray, mask: int, shift: int
) -> tuple[np.ndarray, np.ndarray]:
    """What `choose_bounds` needs to know of a tensor and its step, as counts (int64): per exponent bin, the
    strided sample's elements (`sample_mag`: their |bits|), and per (exponent bin, value bin) the changed elements
    (|bits| `mag_K`, value codes `codes_K`; codes of _VALUE_BINS - 1 or more share the last value bin). The
    numpy reference of `native.bound_histograms`, which reads the same counts off the base in one pass."""
    bins = exponent_bin_count(mask, shift)
    sample_E = np.bincount(sample_mag >> sample_mag.dtype.type(shift), minlength=bins)
    cell = mag_K >> mag_K.dtype.type(shift)  # < 2^11 for every float dtype: the cell index fits the width
    cell <<= mag_K.dtype.type(6)
    cell |= np.minimum(codes_K, codes_K.dtype.type(_VALUE_BINS - 1)).astype(cell.dtype, copy=False)
    changes_EV = np.bincount(cell, minlength=bins * _VALUE_BINS).reshape(bins, _VALUE_BINS)
    return sample_E.astype(np.int64, copy=False), changes_EV.astype(np.int64, copy=False)


def choose_bounds(
    sample_E: np.ndarray,
    n: int,
    changes_EV: np.ndarray,
    shift: int,
    max_classes: int = MAX_CLASSES,
    max_below: float = 1.0,
) -> list[int]:
    """Class bounds (magnitudes at exponent boundaries) minimising estimated bits for this tensor's step.

    sample_E: per exponent bin, the elements of an evenly strided sample of the n base elements (class sizes are
    estimated from it); changes_EV: per (exponent bin, value bin), the changed elements (counted exactly), both
    from `histograms`. Cost of a class = n_c h(k_c / n_c) position bits (n h(k / n) over the whole tensor for the
    top class, which is coded in flat positions) + k_c H(codes | class) + CLASS_COST_BITS. Returns [] (one class)
    when splitting does not pay.
    """
    k_all = changes_EV.sum(axis=1)
    sampled = int(sample_E.sum())
    if not k_all.any() or n < 2 or max_classes < 2 or not sampled:
        return []
    used = np.flatnonzero(k_all)
    lo = int(min(used[0], np.flatnonzero(sample_E)[0]))
    hi = int(max(used[-1], np.flatnonzero(sample_E)[-1])) + 1
    width = hi - lo
    n_e = sample_E[lo:hi] * (n / sampled)
    k_e = k_all[lo:hi].astype(np.float64)
    n_e = np.maximum(n_e, k_e)  # the sample may miss rare exponents that did change
    hist = changes_EV[lo:hi].astype(np.float64)
    cost = _segment_costs(n_e, k_e, hist, n)
    # best[j][b]: cheapest split of bins [0, b) into j classes (the last one of them not the top class)
    inf = float("inf")
    best = np.full((max_classes + 1, width + 1), inf)
    arg = np.zeros((max_classes + 1, width + 1), np.int64)
    best[0][0] = 0.0
    for j in range(1, max_classes):
        totals = best[j - 1][:, None] + cost.below  # [a, b]: classes before a, then [a, b)
        arg[j] = np.argmin(totals, axis=0)
        best[j] = totals[arg[j], np.arange(width + 1)]
    # the top class [a, width) closes the split
    below_n = np.concatenate([[0.0], np.cumsum(n_e)])
    finals = best[:max_classes, :width] + cost.top[None, :width]  # [j, a]: j classes below a top class [a, width)
    finals[:, below_n[:width] > max_below * n] = inf
    j, a = (int(i) for i in np.unravel_index(int(np.argmin(finals)), finals.shape))  # the first minimum: fewest
    # classes, then the lowest top bound
    bounds = []
    while j > 0:
        bounds.append(a)
        a = int(arg[j][a])
        j -= 1
    return [(lo + b) << shift for b in sorted(bounds) if b > 0]


class _Costs:
    """Estimated bits of a class spanning exponent bins [a, b): `below[a, b]` for rank-coded classes and
    `top[a]` for the top class [a, width) coded in flat positions over all n elements."""

    def __init__(self, below: np.ndarray, top: np.ndarray) -> None:
        self.below = below
        self.top = top


def _h(k: np.ndarray, n: np.ndarray) -> np.ndarray:
    """n h(k / n) in bits, elementwise (0 where k is 0 or n)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(n > 0, k / np.maximum(n, 1e-300), 0.0)
        ent = -(p * np.log2(np.where(p > 0, p, 1.0)) + (1 - p) * np.log2(np.where(p < 1, 1 - p, 1.0)))
    return n * ent


def _xlog2x(x: np.ndarray) -> np.ndarray:
    """x log2 x elementwise for counts x >= 0 (0 at 0)."""
    return x * np.log2(np.maximum(x, 1.0))


@functools.cache
def _ranges_of(width: int) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) of every bin range [a, b) with 0 <= a < b <= width."""
    return np.triu_indices(width + 1, 1)


def _segment_costs(n_e: np.ndarray, k_e: np.ndarray, hist: np.ndarray, n: int) -> _Costs:
    """Costs of every bin range [a, b). A range's value bits are its changes' empirical entropy from its
    histogram h (total k): -sum_v h_v log2(h_v / k) = k log2 k - sum_v h_v log2 h_v, so each cell needs one
    log2 and no division; value bins that no change falls in are left out (they add nothing)."""
    width = n_e.size
    hist = hist[:, hist.any(axis=0)]
    cn = np.concatenate([[0.0], np.cumsum(n_e)])
    ck = np.concatenate([[0.0], np.cumsum(k_e)])
    ch = np.concatenate([np.zeros((1, hist.shape[1])), np.cumsum(hist, axis=0)])
    seg_n = cn[None, :] - cn[:, None]  # [a, b]
    seg_k = ck[None, :] - ck[:, None]
    a, b = _ranges_of(width)
    value_bits = np.zeros((width + 1, width + 1))  # [a, b], only a < b: the others' costs are inf
    value_bits[a, b] = _xlog2x(seg_k[a, b]) - _xlog2x(ch[b] - ch[a]).sum(axis=1)
    below = _h(seg_k, seg_n) + value_bits + CLASS_COST_BITS
    below[1:, :] += SPLIT_COST_BITS * cn[None, :]  # a class above the lowest is split off the set below its top
    idx = np.arange(width + 1)
    below[idx[:, None] >= idx[None, :]] = np.inf  # empty or reversed segments
    top = np.full(width + 1, np.inf)
    top[:width] = _h(seg_k[:width, width], np.full(width, float(n))) + value_bits[:width, width] + CLASS_COST_BITS
    return _Costs(below, top)
