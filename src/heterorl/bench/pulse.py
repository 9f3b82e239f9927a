"""Weight-sync benchmark: both patch formats side by side, sizes, entropy bounds and speeds, on one step.

Steps (`run_sync_bench(step=...)`, steps.py): "synthetic" (default): fp32 master weights ~ N(0, 0.02) (norm
weights ~ 1 + N(0, 0.02)) in a Qwen/Llama-like set of shapes, one Adam-like update w - lr * sign(g) with random g
(Adam's first step is exactly lr * sign(g)), both rounded to bf16; with `change_rate` set instead, that share of
bf16 elements (chosen uniformly) moves by +-1 in its bits, i.e. one ULP. "noise": masters minus lr * N(0, 1).
"qwen3": a ~90M-parameter Qwen3's real AdamW step. "demo": the demo run's real RL step.

Reported, all measured in the same run, for "pulse" (format v1, today's codec) and "pulse-ctx" (v2):
* bytes per changed element of the patch (whole blob: header, checksums, all tensors) and the entropy bounds of
  the step (entropy.py): independent positions per tensor, and positions and values given the exponent;
* patch / full bf16 bytes, patch / zstd-1 of the full bf16 bytes, patch / reference layout, where the reference
  layout is the PULSE reference implementation's: each tensor viewed as 2-D (rows x rest), int32 row gaps +
  int32 column gaps (column absolute at each new row) + raw values, zstd-1 over the whole buffer;
* the snapshot (kind "snapshot", byte planes + zstd) size and its encode / checked load speed;
* encode GB/s (hashing base and new included) and decode GB/s (apply_patch: checksum, header checks, in-place
  write with the result hash), GB = bf16 model bytes (numel * 2) / seconds; the headline figures are steady
  state (best of `repeats` calls), the first call in a fresh process is reported too (it pays for page faults);
  a plain copy's GB/s and the load average before and after, to judge a shared machine's figures.

A large size takes minutes (1e9 parameters: 4 GB of bf16 weights, each version encoded and decoded a few times),
so with `verbose` every phase is announced on stderr with the time so far, the total is printed at the end, and a
synthetic or noise step of 1e8 parameters or more is preceded by an estimate of the whole run's time: ten times
that of the same benchmark on a tenth of the size, run first (every phase is linear in the size; the probe costs
a tenth of the run).

CLI: `python -m heterorl.bench.pulse --params 1e9 --lr 1e-6`, `--step qwen3 --lr 1e-5`, or
`--base A.safetensors --new B.safetensors`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zstandard as zstd

from heterorl.bench.steps import STEPS, step_pair, synthetic_shapes, synthetic_step  # noqa: F401  (re-exported)
from heterorl.weights import entropy
from heterorl.weights.format import StateDict, bits_view
from heterorl.weights.hashing import state_hash
from heterorl.weights.patch import apply_patch, encode_patch, patch_info
from heterorl.weights.snapshot import encode_snapshot, load_snapshot


# --- baselines
def reference_layout_nbytes(base: StateDict, new: StateDict, level: int = 1) -> int:
    """Bytes of the PULSE reference layout: per tensor (rows x rest) int32 row gaps, int32 column gaps
    (absolute at each new row) and raw values; zstd over the whole concatenated buffer."""
    buffers = []
    for name in sorted(base):
        b, n = bits_view(base[name]), bits_view(new[name])
        cols = max(1, math.prod(base[name].shape[1:])) if base[name].dim() else 1
        pos = np.flatnonzero(b != n)
        rows, col = pos // cols, pos % cols
        row_gap = np.diff(rows, prepend=0)
        new_row = np.diff(rows, prepend=-1) != 0
        col_gap = np.where(new_row, col, np.diff(col, prepend=0))
        buffers += [row_gap.astype(np.int32).tobytes(), col_gap.astype(np.int32).tobytes(), n[pos].tobytes()]
    return len(zstd.ZstdCompressor(level=level).compress(b"".join(buffers)))


def zstd_full_nbytes(weights: StateDict, level: int = 1) -> int:
    """zstd of every tensor's raw bytes (the naive "compress the checkpoint" baseline)."""
    cctx = zstd.ZstdCompressor(level=level)
    return sum(len(cctx.compress(bits_view(weights[name]))) for name in sorted(weights))


# --- measurement
CODEC_FORMATS = {"pulse": False, "pulse-ctx": True}  # codec name -> encode_patch(context=...)
ESTIMATE_FROM = 100_000_000  # sizes from here on get an estimate first (smaller ones take a minute or less)
PROBE_SHARE = 10  # the estimate's probe is this many times smaller than the run
Phase = Callable[[str], None]


def _quiet(name: str) -> None:
    pass


class PhaseLog:
    """`[  12.3 s] encoding pulse-ctx`: each phase of a long benchmark on stderr, with the time since the start."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def __call__(self, name: str) -> None:
        print(f"[{time.perf_counter() - self.start:7.1f} s] {name}", file=sys.stderr, flush=True)


def measure(
    base: StateDict,
    new: StateDict,
    *,
    level: int = 1,
    workers: int = 1,
    verbose: bool = True,
    repeats: int = 3,
    bounds: bool = True,
    phase: Phase = _quiet,
) -> dict:
    """Both patch formats side by side on one (base, new) pair: sizes vs baselines and entropy bounds, encode and
    checked-decode speed (first call and best of `repeats` steady-state calls), a plain copy's speed. `phase`
    hears the name of each phase as it starts.

    Top-level keys describe "pulse" (v1, today's codec, unchanged for older callers); `ctx` holds the same keys
    for "pulse-ctx" (v2); `bounds` the entropy bounds in bytes (entropy.bounds).
    """
    numel = sum(t.numel() for t in base.values())
    model_bytes = 2 * numel  # bf16 bytes, the unit of the GB/s figures
    full_bytes = sum(t.numel() * t.element_size() for t in base.values())
    load_before = os.getloadavg()
    per_codec = {}
    for name, ctx in CODEC_FORMATS.items():
        phase(f"{name}: encode and checked decode, {1 + max(1, repeats)} times each")
        per_codec[name] = _measure_codec(base, new, ctx, level, workers, repeats)
    v1, v2 = per_codec["pulse"], per_codec["pulse-ctx"]
    changed = v1["changed"]
    phase("baselines: the reference layout and zstd of the full weights")
    reference = reference_layout_nbytes(base, new, level)
    zstd_full = zstd_full_nbytes(base, level)
    phase("snapshot: encode and checked load")
    snapshot_s, snapshot = _timed(lambda: encode_snapshot(new, level=level, workers=workers))
    load_s, _ = _timed(lambda: load_snapshot(snapshot, workers=workers))
    result: dict[str, Any] = {
        "num_params": numel,
        "changed": changed,
        "change_rate": changed / max(1, numel),
        **{k: v for k, v in v1.items() if k != "changed"},
        "full_bytes": full_bytes,
        "zstd_full_bytes": zstd_full,
        "reference_bytes": reference,
        "reference_bytes_per_changed": reference / max(1, changed),
        "patch_over_full": v1["patch_bytes"] / full_bytes,
        "patch_over_zstd_full": v1["patch_bytes"] / zstd_full,
        "patch_over_reference": v1["patch_bytes"] / reference,
        "ctx": {k: v for k, v in v2.items() if k != "changed"},
        "ctx_over_pulse": v2["patch_bytes"] / v1["patch_bytes"],
        "snapshot_bytes": len(snapshot),
        "snapshot_encode_GBps": model_bytes / snapshot_s / 1e9,
        "snapshot_load_GBps": model_bytes / load_s / 1e9,
        "copy_GBps": _copy_gbps(base, model_bytes),
        "workers": workers,
        "load_average": [*load_before, *os.getloadavg()],
    }
    if bounds:
        phase("entropy bounds")
        b = entropy.bounds(base, new)
        result["bounds"] = {
            "independent_bytes": b["independent_bits"] / 8,
            "exponent_bytes": b["exponent_bits"] / 8,
            "independent_per_changed": b["independent_bits"] / 8 / max(1, changed),
            "exponent_per_changed": b["exponent_bits"] / 8 / max(1, changed),
        }
    if verbose:
        print(format_result(result))
    return result


def _measure_codec(
    base: StateDict, new: StateDict, context: bool, level: int, workers: int, repeats: int
) -> dict[str, Any]:
    model_bytes = 2 * sum(t.numel() for t in base.values())

    # First call: fresh memory (page faults are slow in sandboxes); steady: a learner/sampler that encodes or
    # applies every step. Steady decodes apply the patch again after a reverse patch brought back the base.
    def encode() -> bytes:
        return encode_patch(base, new, level=level, workers=workers, context=context)

    encode_s, patch = _timed(encode)
    encode_warm_s = min(_timed(encode)[0] for _ in range(max(1, repeats)))
    changed = patch_info(patch).changed
    decode_s, decode_warm_s = _decode_times(base, new, patch, level, workers, context, repeats)
    return {
        "changed": changed,
        "patch_bytes": len(patch),
        "bytes_per_changed": len(patch) / max(1, changed),
        "encode_s": encode_warm_s,
        "decode_s": decode_warm_s,
        "encode_GBps": model_bytes / encode_warm_s / 1e9,
        "decode_GBps": model_bytes / decode_warm_s / 1e9,
        "encode_cold_GBps": model_bytes / encode_s / 1e9,
        "decode_cold_GBps": model_bytes / decode_s / 1e9,
    }


def _decode_times(
    base: StateDict, new: StateDict, patch: bytes, level: int, workers: int, context: bool, repeats: int
) -> tuple[float, float]:
    """(first, best steady-state) seconds of apply_patch on a copy of base, each result checked against new."""
    weights = {name: t.clone() for name, t in base.items()}
    new_hash = state_hash(new)
    cold_s, _ = _timed(lambda: apply_patch(weights, patch, workers=workers))
    assert state_hash(weights) == new_hash, "decoded weights differ from the new weights"
    back = encode_patch(new, base, level=level, workers=workers, context=context)
    warm = []
    for _ in range(max(1, repeats)):
        apply_patch(weights, back, workers=workers)
        warm.append(_timed(lambda: apply_patch(weights, patch, workers=workers))[0])
        assert state_hash(weights) == new_hash, "decoded weights differ from the new weights"
    return cold_s, min(warm)


def _copy_gbps(weights: StateDict, model_bytes: int) -> float:
    """Speed of a plain copy of the weights into preallocated memory (the machine's yardstick right now)."""
    views = [bits_view(weights[name]) for name in sorted(weights)]
    out = [np.empty_like(v) for v in views]
    seconds = []
    for _ in range(3):
        start = time.perf_counter()
        for src, dst in zip(views, out, strict=True):
            np.copyto(dst, src)
        seconds.append(time.perf_counter() - start)
    return model_bytes / min(seconds) / 1e9


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def format_result(r: Mapping[str, Any]) -> str:
    """Human-readable summary of `measure`'s dict: both codecs side by side, then the baselines."""
    c = r["ctx"]
    load = r["load_average"]
    lines = [
        f"params {r['num_params']:,}  changed {r['changed']:,} ({100 * r['change_rate']:.3f}%)  "
        f"workers={r['workers']}  load average {load[0]:.2f} (before) {load[3]:.2f} (after)",
        f"{'':26s} {'pulse (v1)':>16s} {'pulse-ctx (v2)':>16s}",
        f"{'patch bytes':26s} {r['patch_bytes']:16,} {c['patch_bytes']:16,}   v2/v1 = {r['ctx_over_pulse']:.3f}",
        f"{'bytes / changed element':26s} {r['bytes_per_changed']:16.3f} {c['bytes_per_changed']:16.3f}",
        f"{'encode GB/s (first call)':26s} {_speed(r['encode_GBps'], r['encode_cold_GBps'])}"
        f" {_speed(c['encode_GBps'], c['encode_cold_GBps'])}",
        f"{'checked decode GB/s':26s} {_speed(r['decode_GBps'], r['decode_cold_GBps'])}"
        f" {_speed(c['decode_GBps'], c['decode_cold_GBps'])}",
    ]
    if "bounds" in r:
        b = r["bounds"]
        lines.append(
            f"entropy bounds            independent positions {b['independent_per_changed']:.3f} B/changed, "
            f"exponent-conditioned {b['exponent_per_changed']:.3f} B/changed"
        )
    lines += [
        f"vs full                   v1 {r['patch_over_full']:.5f} x ({r['full_bytes']:,} B; "
        f"{1 / r['patch_over_full']:.0f}x smaller)",
        f"vs zstd-1 full            v1 {r['patch_over_zstd_full']:.5f} x ({r['zstd_full_bytes']:,} B)",
        f"vs reference layout       v1 {r['patch_over_reference']:.3f} x, v2 "
        f"{c['patch_bytes'] / r['reference_bytes']:.3f} x ({r['reference_bytes']:,} B = "
        f"{r['reference_bytes_per_changed']:.3f} B/changed element)",
        f"snapshot                  {r['snapshot_bytes']:,} B; encode {r['snapshot_encode_GBps']:.2f} GB/s, "
        f"load (checked) {r['snapshot_load_GBps']:.2f} GB/s",
        f"plain copy                {r['copy_GBps']:.2f} GB/s (GB = bf16 model bytes)",
    ]
    return "\n".join(lines)


def _speed(steady: float, first: float) -> str:
    return f"{steady:9.2f} ({first:4.2f})"


def run_sync_bench(
    num_params: int,
    change_rate: float | None = None,
    lr: float = 1e-6,
    seed: int = 0,
    *,
    level: int = 1,
    workers: int = 1,
    verbose: bool = True,
    step: str = "synthetic",
    repeats: int = 3,
) -> dict:
    """One-step benchmark of both codecs on a step of kind `step` (steps.STEPS; module docstring); returns
    `measure`'s dict plus the inputs. With `verbose`, progress on stderr (and first an estimate for a size)."""
    phase: Phase = PhaseLog() if verbose else _quiet
    sized = step in ("synthetic", "noise")
    if verbose and sized and num_params >= ESTIMATE_FROM:
        probe = num_params // PROBE_SHARE
        phase(f"estimating the time: the same benchmark on {probe:.3g} parameters")
        probe_s, _ = _timed(
            lambda: run_sync_bench(
                probe, change_rate, lr, seed, level=level, workers=workers, verbose=False, step=step, repeats=repeats
            )
        )
        print(
            f"{num_params:.3g} parameters: about {format_duration(PROBE_SHARE * probe_s)} more ({PROBE_SHARE}x the "
            f"probe; load average {os.getloadavg()[0]:.1f}), {4 * num_params / 1e9:.1f} GB of bf16 weights in "
            "memory; --params sets the size",
            file=sys.stderr,
            flush=True,
        )
    start = time.perf_counter()
    phase(f"building the {step} step" + (f" ({num_params:.3g} parameters)" if sized else ""))
    base, new = step_pair(step, num_params, lr, change_rate, seed)
    result = measure(base, new, level=level, workers=workers, verbose=False, repeats=repeats, phase=phase)
    took = format_duration(time.perf_counter() - start)
    phase(f"done: {f'{num_params:.3g} parameters' if sized else f'the {step} step'} took {took}")
    if verbose:
        print(format_result(result))
    lr_used = None if step == "demo" or (step == "synthetic" and change_rate is not None) else lr
    return {"step": step, "lr": lr_used, "requested_change_rate": change_rate, **result}


def format_duration(seconds: float) -> str:
    """`45 s`, `12 min`, `1.5 h`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def load_checkpoint(source: str | Path | StateDict, dtype: torch.dtype | None = torch.bfloat16) -> StateDict:
    """State dict from a .safetensors file, a directory of them, or a state dict; floats cast to `dtype`."""
    if isinstance(source, Mapping):
        weights = dict(source)
    else:
        from safetensors.torch import load_file

        path = Path(source)
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        weights = {}
        for f in files:
            weights |= load_file(f)
    if dtype is not None:
        weights = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in weights.items()}
    return weights


def compare_checkpoints(
    base: str | Path | StateDict,
    new: str | Path | StateDict,
    *,
    dtype: torch.dtype | None = torch.bfloat16,
    level: int = 1,
    workers: int = 1,
    verbose: bool = True,
) -> dict:
    """`measure` on two real checkpoints (floats cast to `dtype`, the samplers' dtype)."""
    base_w, new_w = load_checkpoint(base, dtype), load_checkpoint(new, dtype)
    return measure(base_w, new_w, level=level, workers=workers, verbose=verbose)


def main(argv: list[str] | None = None) -> dict:
    """CLI entry point (see module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--step", choices=STEPS, default="synthetic", help="kind of step (steps.py)")
    parser.add_argument("--params", type=float, default=1e8, help="synthetic model size (parameters)")
    parser.add_argument("--change-rate", type=float, default=None, help="share of bf16 elements moved by 1 ULP")
    parser.add_argument("--lr", type=float, default=1e-6, help="learning rate of the step")
    parser.add_argument("--repeats", type=int, default=3, help="steady-state timings: best of this many")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--level", type=int, default=1, help="zstd level")
    parser.add_argument("--workers", type=int, default=1, help="threads for encode/decode")
    parser.add_argument("--base", help="base checkpoint (.safetensors file or directory) instead of synthetic")
    parser.add_argument("--new", help="new checkpoint, with --base")
    parser.add_argument("--json", help="also write the result dict to this JSON file")
    args = parser.parse_args(argv)
    if args.base or args.new:
        if not (args.base and args.new):
            parser.error("--base and --new go together")
        result = compare_checkpoints(args.base, args.new, level=args.level, workers=args.workers)
    else:
        result = run_sync_bench(
            int(args.params),
            args.change_rate,
            args.lr,
            args.seed,
            level=args.level,
            workers=args.workers,
            step=args.step,
            repeats=args.repeats,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
