"""Weight-sync benchmark: patch size and encode/decode speed on synthetic steps or real checkpoints.

Synthetic step (`run_sync_bench`): fp32 master weights ~ N(0, 0.02) (norm weights ~ 1 + N(0, 0.02)) in a
Qwen/Llama-like set of shapes, one Adam-like update w - lr * sign(g) with random g (Adam's first step is exactly
lr * sign(g)), both rounded to bf16. With `change_rate` set instead, that share of bf16 elements (chosen
uniformly) moves by +-1 in its bits, i.e. one ULP, the typical Adam move.

Reported, all measured in the same run:
* bytes per changed element of the PULSE patch (whole blob: header, checksums, all tensors);
* patch / full bf16 bytes, patch / zstd-1 of the full bf16 bytes, patch / reference layout, where the reference
  layout is the PULSE reference implementation's: each tensor viewed as 2-D (rows x rest), int32 row gaps +
  int32 column gaps (column absolute at each new row) + raw values, zstd-1 over the whole buffer;
* the snapshot (kind "snapshot", byte planes + zstd) size and its encode / checked load speed;
* encode GB/s (hashing base and new included) and decode GB/s (apply_patch: checksum, base hash, result hash
  on scratch, in-place write), GB = bf16 model bytes (numel * 2) / seconds; the headline figures are steady
  state (second call), the first call in a fresh process is reported too (it pays for page faults).

CLI: `python -m heterorl.weights.bench --params 1e9 --lr 1e-6` or `--base A.safetensors --new B.safetensors`.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zstandard as zstd

from heterorl.weights.format import StateDict, bits_view
from heterorl.weights.hashing import state_hash
from heterorl.weights.patch import apply_patch, encode_patch, patch_info
from heterorl.weights.snapshot import encode_snapshot, load_snapshot


# --- synthetic weights
def synthetic_shapes(num_params: int) -> dict[str, tuple[int, ...]]:
    """A decoder-only transformer's tensor shapes totalling roughly `num_params` (hidden d, GQA kv = d/4)."""
    d = max(64, 2 ** round(math.log2(math.sqrt(num_params / (24 * 10.5)))))
    ff = max(64, round(8 * d / 3 / 64) * 64)
    vocab = min(32768, 8 * d)
    per_layer = 2 * d * d + 2 * d * (d // 4) + 3 * d * ff + 2 * d
    layers = max(1, round((num_params - vocab * d - d) / per_layer))
    shapes: dict[str, tuple[int, ...]] = {"embed_tokens.weight": (vocab, d), "norm.weight": (d,)}
    for i in range(layers):
        p = f"layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (d, d),
            p + "self_attn.k_proj.weight": (d // 4, d),
            p + "self_attn.v_proj.weight": (d // 4, d),
            p + "self_attn.o_proj.weight": (d, d),
            p + "mlp.gate_proj.weight": (ff, d),
            p + "mlp.up_proj.weight": (ff, d),
            p + "mlp.down_proj.weight": (d, ff),
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
        }
    return shapes


def synthetic_step(
    num_params: int, change_rate: float | None, lr: float, seed: int
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(base, new) bf16 state dicts one optimizer step apart; generated tensor by tensor to bound memory."""
    gen = torch.Generator().manual_seed(seed)
    base, new = {}, {}
    for name, shape in synthetic_shapes(num_params).items():
        master = torch.randn(shape, generator=gen).mul_(0.02)
        if name.endswith("norm.weight"):
            master += 1.0
        base[name] = master.bfloat16()
        if change_rate is None:
            step = torch.randn(shape, generator=gen).sign_().mul_(lr)
            new[name] = master.sub_(step).bfloat16()
        else:
            bits = base[name].view(torch.int16)
            ulp = torch.randint(0, 2, shape, generator=gen, dtype=torch.int16).mul_(2).sub_(1)
            moved = torch.rand(shape, generator=gen) < change_rate
            new[name] = torch.where(moved, bits + ulp, bits).view(torch.bfloat16)
        del master
    return base, new


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
def measure(base: StateDict, new: StateDict, *, level: int = 1, workers: int = 1, verbose: bool = True) -> dict:
    """Patch size vs baselines and encode/decode speed for one (base, new) pair."""
    numel = sum(t.numel() for t in base.values())
    model_bytes = 2 * numel  # bf16 bytes, the unit of the GB/s figures
    full_bytes = sum(t.numel() * t.element_size() for t in base.values())

    # Cold = first call in this process (fresh memory: page faults are slow in sandboxes); warm = steady state
    # of a learner/sampler that encodes/applies every step. The warm decode applies the patch again after a
    # reverse patch brought the weights back to base.
    encode_s, patch = _timed(lambda: encode_patch(base, new, level=level, workers=workers))
    encode_warm_s, _ = _timed(lambda: encode_patch(base, new, level=level, workers=workers))
    changed = patch_info(patch).changed
    decode_s, decode_warm_s = _decode_times(base, new, patch, level, workers)

    reference = reference_layout_nbytes(base, new, level)
    zstd_full = zstd_full_nbytes(base, level)
    snapshot_s, snapshot = _timed(lambda: encode_snapshot(new, level=level, workers=workers))
    load_s, _ = _timed(lambda: load_snapshot(snapshot, workers=workers))
    result: dict[str, Any] = {
        "num_params": numel,
        "changed": changed,
        "change_rate": changed / max(1, numel),
        "patch_bytes": len(patch),
        "bytes_per_changed": len(patch) / max(1, changed),
        "full_bytes": full_bytes,
        "zstd_full_bytes": zstd_full,
        "reference_bytes": reference,
        "reference_bytes_per_changed": reference / max(1, changed),
        "patch_over_full": len(patch) / full_bytes,
        "patch_over_zstd_full": len(patch) / zstd_full,
        "patch_over_reference": len(patch) / reference,
        "encode_s": encode_warm_s,
        "decode_s": decode_warm_s,
        "encode_GBps": model_bytes / encode_warm_s / 1e9,
        "decode_GBps": model_bytes / decode_warm_s / 1e9,
        "snapshot_bytes": len(snapshot),
        "snapshot_encode_GBps": model_bytes / snapshot_s / 1e9,
        "snapshot_load_GBps": model_bytes / load_s / 1e9,
        "encode_cold_GBps": model_bytes / encode_s / 1e9,
        "decode_cold_GBps": model_bytes / decode_s / 1e9,
        "workers": workers,
    }
    if verbose:
        print(format_result(result))
    return result


def _decode_times(base: StateDict, new: StateDict, patch: bytes, level: int, workers: int) -> tuple[float, float]:
    """(first, steady-state) seconds of apply_patch on a copy of base, each result checked against new."""
    weights = {name: t.clone() for name, t in base.items()}
    cold_s, _ = _timed(lambda: apply_patch(weights, patch, workers=workers))
    assert state_hash(weights) == state_hash(new), "decoded weights differ from the new weights"
    apply_patch(weights, encode_patch(new, base, level=level, workers=workers), workers=workers)
    warm_s, _ = _timed(lambda: apply_patch(weights, patch, workers=workers))
    assert state_hash(weights) == state_hash(new), "decoded weights differ from the new weights"
    return cold_s, warm_s


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def format_result(r: Mapping[str, Any]) -> str:
    """Human-readable summary of `measure`'s dict."""
    return "\n".join(
        [
            f"params            {r['num_params']:,}  changed {r['changed']:,} ({100 * r['change_rate']:.3f}%)",
            f"patch             {r['patch_bytes']:,} B = {r['bytes_per_changed']:.3f} B/changed element",
            f"vs full           {r['patch_over_full']:.5f} x ({r['full_bytes']:,} B; "
            f"{1 / r['patch_over_full']:.0f}x smaller)",
            f"vs zstd-1 full    {r['patch_over_zstd_full']:.5f} x ({r['zstd_full_bytes']:,} B)",
            f"vs reference      {r['patch_over_reference']:.3f} x ({r['reference_bytes']:,} B = "
            f"{r['reference_bytes_per_changed']:.3f} B/changed element)",
            f"encode            {r['encode_s']:.3f} s = {r['encode_GBps']:.2f} GB/s of bf16 model bytes "
            f"(first call {r['encode_cold_GBps']:.2f} GB/s); workers={r['workers']}",
            f"decode (checked)  {r['decode_s']:.3f} s = {r['decode_GBps']:.2f} GB/s "
            f"(first call {r['decode_cold_GBps']:.2f} GB/s)",
            f"snapshot          {r['snapshot_bytes']:,} B; encode {r['snapshot_encode_GBps']:.2f} GB/s, "
            f"load (checked) {r['snapshot_load_GBps']:.2f} GB/s",
        ]
    )


def run_sync_bench(
    num_params: int,
    change_rate: float | None = None,
    lr: float = 1e-6,
    seed: int = 0,
    *,
    level: int = 1,
    workers: int = 1,
    verbose: bool = True,
) -> dict:
    """Synthetic one-step benchmark (module docstring); returns `measure`'s dict plus the inputs."""
    base, new = synthetic_step(num_params, change_rate, lr, seed)
    result = measure(base, new, level=level, workers=workers, verbose=verbose)
    return {"lr": lr if change_rate is None else None, "requested_change_rate": change_rate, **result}


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
    parser.add_argument("--params", type=float, default=1e8, help="synthetic model size (parameters)")
    parser.add_argument("--change-rate", type=float, default=None, help="share of bf16 elements moved by 1 ULP")
    parser.add_argument("--lr", type=float, default=1e-6, help="step size of the lr * sign(g) update")
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
            int(args.params), args.change_rate, args.lr, args.seed, level=args.level, workers=args.workers
        )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
