"""Codec speed: the compiled kernels against the numpy reference, both patch formats, one or more threads.

Per (step, format, threads): encode (`encode_patch` as the store calls it, the base's hash known: diff scan with
the new weights' hash, coding, container) and checked decode (`apply_patch`: checksum, header checks, in-place
write with the result hash, reverted on a mismatch), each the best of `repeats` steady-state calls, in GB of bf16
model bytes (2 x parameters) per second of process CPU time (the figure that does not move with other processes'
load) and per wall second (what threads buy). The numpy reference runs in the same process right after
(`native.use(False)`); the table gives native / numpy ratios, and every run checks that both paths wrote the
same bytes and decoded the same bits. The load average is printed with every row: on a shared machine CPU-time
figures still inflate when other processes contend for caches and memory.

    python benchmarks/codec_speed.py        # synthetic 70M and Qwen3 ~90M (lr 1e-6), 1 and 2 threads
    python benchmarks/codec_speed.py --threads 1 16 --steps synthetic
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
import xxhash

from heterorl.bench.steps import step_pair
from heterorl.weights import native
from heterorl.weights.format import StateDict, bits_view
from heterorl.weights.hashing import state_hash
from heterorl.weights.patch import apply_patch, encode_patch

FORMATS = {"pulse (v1)": False, "pulse-ctx (v2)": True}
STEP_LABELS = {
    "synthetic": "synthetic 70M, lr 1e-6",
    "qwen3": "Qwen3 ~90M AdamW, lr 1e-6",
    "noise": "noise 70M, lr 1e-6",
}


def _best(fn: Callable[[], Any], repeats: int, before: Callable[[], Any] | None = None) -> tuple[float, float, Any]:
    """(best CPU seconds, best wall seconds, last result) over `repeats` calls; `before` runs untimed first."""
    cpu, wall, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        if before is not None:
            before()
        c0, w0 = time.process_time(), time.perf_counter()
        out = fn()
        cpu, wall = min(cpu, time.process_time() - c0), min(wall, time.perf_counter() - w0)
    return cpu, wall, out


def measure_format(
    base: StateDict, new: StateDict, context: bool, threads: int, repeats: int
) -> dict[str, float | bytes]:
    """Encode and checked-decode seconds (CPU and wall) of one format at `threads`, in the current kernel mode."""
    weights = {k: v.clone() for k, v in base.items()}
    base_hash = state_hash(base)  # known to the encoder, as the store knows its previous version's
    encode = lambda: encode_patch(base, new, context=context, workers=threads, base_hash=base_hash)  # noqa: E731
    patch = encode()  # warm-up: page faults, pools, zstd contexts
    back = encode_patch(new, base, context=context, workers=threads)
    enc_cpu, enc_wall, _ = _best(encode, repeats)
    apply_patch(weights, patch, workers=threads)
    dec_cpu, dec_wall, _ = _best(
        lambda: apply_patch(weights, patch, workers=threads),
        repeats,
        before=lambda: apply_patch(weights, back, workers=threads),
    )
    if not all(torch.equal(bits_view_t(weights[k]), bits_view_t(new[k])) for k in new):
        raise AssertionError("decoded weights differ from the new weights")
    return {"enc_cpu": enc_cpu, "enc_wall": enc_wall, "dec_cpu": dec_cpu, "dec_wall": dec_wall, "patch": patch}


def bits_view_t(t: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(bits_view(t))


def codec_rows(
    steps: Sequence[str],
    threads: Sequence[int],
    repeats: int = 3,
    reference: bool = True,
    num_params: int = 70_000_000,
) -> list[dict]:
    """One row per (step, format, threads): native and (when `reference`) numpy figures, GB/s and ratios.
    `num_params` sizes the synthetic and noise steps (the Qwen3 step has its own ~90M)."""
    rows = []
    for step in steps:
        base, new = step_pair(step, num_params, 1e-6)
        model_gb = 2 * sum(t.numel() for t in base.values()) / 1e9
        for label, context in FORMATS.items():
            for n in threads:
                step_label = STEP_LABELS.get(step, step).format(m=round(num_params / 1e6))
                row: dict[str, Any] = {"step": step_label, "format": label, "threads": n}
                paths = {"native": True, "numpy": False} if reference else {"native": True}
                patches = {}
                for path, flag in paths.items():
                    with native.use(flag):
                        m = measure_format(base, new, context, n, repeats)
                    patches[path] = m.pop("patch")
                    for key, seconds in m.items():
                        row[f"{path}_{key}"] = model_gb / float(seconds)  # type: ignore[arg-type]
                if reference and patches["native"] != patches["numpy"]:
                    raise AssertionError(f"{step} {label}: the kernels and the numpy reference wrote different bytes")
                row["patch_bytes"] = len(patches["native"])
                row["load"] = os.getloadavg()[0]
                rows.append(row)
                print(format_row(row), flush=True)
    return rows


def read_speed(threads: int, nbytes: int = 280_000_000, repeats: int = 3) -> float:
    """GB/s (wall) at which `threads` threads hash `nbytes` of fresh arrays with xxh3, one array of 1.4 MB per
    task: the machine's memory read speed, which bounds the codec's passes over the weights. On a machine whose
    memory one core already saturates, more threads do not read faster (and the codec's scan cannot scale)."""
    parts = [np.ones(700_000, np.uint16) for _ in range(max(1, nbytes // 1_400_000))]
    digest = lambda a: xxhash.xxh3_128(a).digest()  # noqa: E731
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            w0 = time.perf_counter()
            if threads > 1:
                list(pool.map(digest, parts))
            else:  # in this thread: a hand-off per array would be timed too
                [digest(a) for a in parts]
            best = min(best, time.perf_counter() - w0)
    return sum(a.nbytes for a in parts) / best / 1e9


def memory_line(threads: Sequence[int]) -> str:
    """One line: the memory read speed at each thread count, and its ratio to one thread's."""
    one = read_speed(1)
    speeds = [f"1 thread {one:.1f} GB/s"] + [f"{n} threads x{read_speed(n) / one:.2f}" for n in threads if n > 1]
    return "memory read (xxh3 over 280 MB, wall): " + ", ".join(speeds)


HEADER = (
    f"{'step':26s} {'format':15s} {'thr':>3s} {'enc GB/s':>9s} {'dec GB/s':>9s} {'enc wall':>9s} {'dec wall':>9s} "
    f"{'numpy enc':>9s} {'numpy dec':>9s} {'x enc':>6s} {'x dec':>6s} {'load':>5s}"
)


def format_row(r: dict) -> str:
    """A table row: native GB/s per CPU-second and per wall second, numpy per CPU-second, ratios (CPU)."""
    numpy_enc = r.get("numpy_enc_cpu")
    ref = (
        f"{numpy_enc:9.2f} {r['numpy_dec_cpu']:9.2f} {r['native_enc_cpu'] / numpy_enc:6.1f} "
        f"{r['native_dec_cpu'] / r['numpy_dec_cpu']:6.1f}"
        if numpy_enc
        else f"{'-':>9s} {'-':>9s} {'-':>6s} {'-':>6s}"
    )
    return (
        f"{r['step']:26s} {r['format']:15s} {r['threads']:3d} {r['native_enc_cpu']:9.2f} {r['native_dec_cpu']:9.2f} "
        f"{r['native_enc_wall']:9.2f} {r['native_dec_wall']:9.2f} {ref} {r['load']:5.2f}"
    )


def thread_speedups(rows: list[dict]) -> list[str]:
    """Wall-clock speed-up of each multi-thread row over the same step and format at one thread."""
    one = {(r["step"], r["format"]): r for r in rows if r["threads"] == 1}
    out = []
    for r in rows:
        base = one.get((r["step"], r["format"]))
        if r["threads"] > 1 and base is not None:
            enc = r["native_enc_wall"] / base["native_enc_wall"]
            dec = r["native_dec_wall"] / base["native_dec_wall"]
            out.append(f"{r['step']} {r['format']} {r['threads']} threads: encode x{enc:.2f}, decode x{dec:.2f} (wall)")
    return out
