"""Choosing the split point k of many integer streams at once (`intcode.choose_k`, vectorised over streams).

A v1 patch of a 227-tensor model has 454 streams (gaps and value codes per tensor); `choose_k` looks at a
2048-element sample of each and prices every candidate k with a handful of numpy operations, ~60 calls per
stream: ~30 ms of Python and numpy overhead per encode, as much as the whole diff scan of a 70M-parameter step
costs in memory traffic. Here all streams' samples are priced together: one dense histogram of every sample,
the symbol histograms of every (stream, candidate k) row from one bincount, the costs from array arithmetic.

The result must equal `choose_k` exactly (the patch bytes depend on it). Every integer quantity (histograms,
escape counts, widths, the candidate set) is the same by construction; only the entropy's floating-point
rounding differs (a row-wise sum instead of one sum per candidate). Candidates with identical histograms and
escape terms get identical costs either way, so the first one wins as in `choose_k`; wherever two different
candidates' costs lie within REFINE of each other, the stream is re-priced by `choose_k` itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from heterorl.weights.intcode import ESCAPE, choose_k_sample, sample

REFINE = 1e-9  # bits: costs this close are re-decided by choose_k's own arithmetic (rounding is ~1e-15)
_DENSE = 4  # a sample is histogrammed densely when its largest value is below this many times its size


def choose_ks(streams: Sequence[np.ndarray]) -> list[int]:
    """`[choose_k(x) for x in streams]`, computed for all streams together."""
    return choose_ks_samples([sample(x) for x in streams], [x.dtype.itemsize * 8 for x in streams])


def choose_ks_samples(stream_samples: Sequence[np.ndarray], stream_bits: Sequence[int]) -> list[int]:
    """`choose_k` of every stream given its sample (`intcode.sample`; empty for an empty stream: k = 0) and its
    integer width in bits, computed for all streams together."""
    ks = [0] * len(stream_samples)
    batch: list[int] = []
    samples: list[np.ndarray] = []
    for i, (sample_S, bits) in enumerate(zip(stream_samples, stream_bits, strict=True)):
        if sample_S.size == 0:
            continue
        if bits > 32:  # 64-bit streams (rare): values may not fit the batch's int64 keys
            ks[i] = choose_k_sample(sample_S, bits)
            continue
        batch.append(i)
        samples.append(sample_S)
    if not batch:
        return ks
    lengths = np.array([s.size for s in samples], np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)))
    values = np.concatenate(samples, dtype=np.int64)
    tops = np.maximum.reduceat(values, starts[:-1])
    dense = tops < _DENSE * lengths
    for j in np.flatnonzero(~dense).tolist():
        ks[batch[j]] = choose_k_sample(samples[j], stream_bits[batch[j]])
    keep = np.flatnonzero(dense)
    if keep.size:
        chosen = _choose_dense(
            [samples[j] for j in keep.tolist()], [stream_bits[batch[j]] for j in keep.tolist()], tops[keep]
        )
        for j, k in zip(keep.tolist(), chosen, strict=True):
            ks[batch[j]] = k if k >= 0 else choose_k_sample(samples[j], stream_bits[batch[j]])
    return ks


def _choose_dense(samples: list[np.ndarray], bits: list[int], tops: np.ndarray) -> list[int]:
    """k per sample (-1: too close to call here, use choose_k), all samples histogrammed densely."""
    lengths = np.array([s.size for s in samples], np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)))
    bins = tops + 1
    offsets = np.concatenate(([0], np.cumsum(bins)))
    values = np.concatenate(samples, dtype=np.int64)
    values += np.repeat(offsets[:-1], lengths)
    counts = np.bincount(values, minlength=int(offsets[-1]))
    cum = np.concatenate(([0], np.cumsum(counts)))  # cum[offsets[i]] == starts[i]
    # median: the element of rank len // 2 in each sample, as choose_k finds it
    medians = np.searchsorted(cum[1:], starts[:-1] + lengths // 2, side="right") - offsets[:-1]
    rows_stream, rows_k = [], []
    for i, (median, width) in enumerate(zip(medians.tolist(), bits, strict=True)):
        center = int(median).bit_length()
        for k in range(max(0, center - 2), min(width - 1, center + 1) + 1):
            if k % 8 != 7:
                rows_stream.append(i)
                rows_k.append(k)
    stream = np.array(rows_stream, np.int64)
    k_R = np.array(rows_k, np.int64)
    n_rows = k_R.size
    # every (row, value) pair: the row's stream's dense values 0 .. top, weighted by their counts
    row_bins = bins[stream]
    row_starts = np.concatenate(([0], np.cumsum(row_bins)))
    row_of = np.repeat(np.arange(n_rows), row_bins)
    value = np.arange(int(row_starts[-1]), dtype=np.int64) - np.repeat(row_starts[:-1], row_bins)
    weight = counts[np.repeat(offsets[:-1][stream], row_bins) + value]
    k_E = k_R[row_of]
    r_E = k_E % 8
    y = value >> (8 * (k_E // 8))
    symbol = np.minimum(y, (y & ((1 << r_E) - 1)) | (ESCAPE << r_E))  # intcode._symbols, per element's k
    hist = np.bincount(row_of * 256 + symbol, weights=weight, minlength=n_rows * 256).reshape(n_rows, 256)
    total = lengths[stream].astype(np.float64)
    p = hist / total[:, None]
    log_p = np.log2(p, out=np.zeros_like(p), where=p > 0)
    entropy = -(p * log_p).sum(axis=1)
    # escapes: sample elements >= ESCAPE << k, in whole bytes of (top >> k) - ESCAPE
    below = np.minimum(ESCAPE << k_R, bins[stream])
    escaped = lengths[stream] - (cum[offsets[:-1][stream] + below] - starts[:-1][stream])
    high = np.maximum((tops[stream] >> k_R) - ESCAPE, 0)
    width = np.where(high < 1 << 8, 1, np.where(high < 1 << 16, 2, np.where(high < 1 << 32, 4, 8)))
    esc_bytes = np.where(escaped > 0, width, 0)
    cost = 8 * (k_R // 8) + entropy + 8 * esc_bytes * escaped / total
    return _pick(stream, k_R, cost, hist, esc_bytes * escaped, len(samples))


def _pick(
    stream: np.ndarray, k_R: np.ndarray, cost: np.ndarray, hist: np.ndarray, esc: np.ndarray, n: int
) -> list[int]:
    """First cheapest candidate per stream, or -1 where a different candidate is within REFINE of it."""
    bounds = np.concatenate(([0], np.cumsum(np.bincount(stream, minlength=n)))).tolist()
    out = []
    cost_l, k_l, esc_l = cost.tolist(), k_R.tolist(), esc.tolist()
    for s in range(n):
        lo, hi = bounds[s], bounds[s + 1]
        best = min(range(lo, hi), key=lambda r: (cost_l[r], r))
        close = [r for r in range(lo, hi) if r != best and abs(cost_l[r] - cost_l[best]) <= REFINE]
        same = all(
            k_l[r] // 8 == k_l[best] // 8 and esc_l[r] == esc_l[best] and np.array_equal(hist[r], hist[best])
            for r in close
        )
        out.append(k_l[best] if same else -1)
    return out
