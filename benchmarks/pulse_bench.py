"""PULSE codec figures in one command: v1 ("pulse") vs v2 ("pulse-ctx") on realistic steps, speed before/after.

    python benchmarks/pulse_bench.py                 # everything below (~10 min on 2 idle cores, ~6 GB RSS)
    python benchmarks/pulse_bench.py --quick         # smaller models, for a smoke run
    python benchmarks/pulse_bench.py --contexts      # also the entropy of positions/values per context

1. Realistic steps (issue 19): the demo's RL step, a ~90M-parameter Qwen3's real AdamW steps at lr 1e-6 and
   1e-5, a synthetic master-weights-plus-noise step at ~70M parameters. Per step, both formats on the same bytes:
   bytes per changed element, v2/v1, the two entropy bounds (independent positions; exponent-conditioned), encode
   and checked-decode GB/s (steady state, best of 3) at 1 and 2 threads, a plain copy's GB/s and the load average.
2. Speed before/after (issue 17): the synthetic 70M-parameter step with 3% of bf16 elements moved by one ULP,
   and the lr 1e-6 sign step: today's code at --baseline (a git revision, run from `git archive` in a
   subprocess) against this tree, same step, same machine, one after the other.
3. With --contexts: bits per changed element of positions (empirical, adaptive KT) and values under each
   candidate context (entropy.py), for the realistic steps.

GB = bf16 model bytes (2 x parameters). Figures on a shared machine move with its load: the load average is
printed next to every row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from heterorl.bench.pulse import measure  # noqa: E402
from heterorl.bench.steps import step_pair  # noqa: E402
from heterorl.weights import entropy  # noqa: E402

BASELINE = "d6dff4c"  # main before the PULSE v2 work (today's codec)


def realistic_steps(quick: bool, kinds: list[str]) -> list[tuple[str, dict]]:
    noise_params = 4_000_000 if quick else 70_000_000
    steps = [("demo RL step (lr 1e-4)", {"kind": "demo"})]
    if not quick:
        steps += [
            ("Qwen3 ~90M AdamW, lr 1e-6", {"kind": "qwen3", "lr": 1e-6}),
            ("Qwen3 ~90M AdamW, lr 1e-5", {"kind": "qwen3", "lr": 1e-5}),
        ]
    steps.append((f"noise {noise_params / 1e6:.0f}M, lr 1e-6", {"kind": "noise", "num_params": noise_params}))
    return [s for s in steps if s[1]["kind"] in kinds]


def section_realistic(quick: bool, workers: list[int], contexts: bool, kinds: list[str]) -> list[dict]:
    print("\n== 1. Realistic steps: pulse (v1) vs pulse-ctx (v2), same step ==")
    header = (
        f"{'step':28s} {'params':>11s} {'changed':>8s} {'v1 B/ch':>8s} {'v2 B/ch':>8s} {'v2/v1':>6s} "
        f"{'indep':>6s} {'expo':>6s} {'thr':>3s} {'v1 enc':>6s} {'v1 dec':>6s} {'v2 enc':>6s} {'v2 dec':>6s} "
        f"{'copy':>5s} {'load':>5s}"
    )
    print(header + "\n" + "-" * len(header))
    rows = []
    for label, spec in realistic_steps(quick, kinds):
        base, new = step_pair(**spec)
        for i, w in enumerate(workers):
            r = measure(base, new, workers=w, verbose=False, bounds=i == 0)
            if i == 0:
                bounds = r["bounds"]
            c = r["ctx"]
            print(
                f"{label if i == 0 else '':28s} {r['num_params']:11,} {100 * r['change_rate']:7.2f}% "
                f"{r['bytes_per_changed']:8.3f} {c['bytes_per_changed']:8.3f} {r['ctx_over_pulse']:6.3f} "
                f"{bounds['independent_per_changed']:6.3f} {bounds['exponent_per_changed']:6.3f} {w:3d} "
                f"{r['encode_GBps']:6.2f} {r['decode_GBps']:6.2f} {c['encode_GBps']:6.2f} {c['decode_GBps']:6.2f} "
                f"{r['copy_GBps']:5.1f} {r['load_average'][3]:5.2f}",
                flush=True,
            )
            rows.append(
                {"step": label, "workers": w, **{k: v for k, v in r.items() if k != "bounds"}, "bounds": bounds}
            )
        if contexts:
            table = entropy.step_entropy(base, new)
            print(f"  entropy by context, {label} (bits / changed element):")
            print("  " + entropy.format_table(table).replace("\n", "\n  "))
            rows[-1]["contexts"] = table
    print(
        "B/ch: bytes per changed element (whole blob). indep / expo: entropy bounds in B/ch (independent positions "
        "per tensor; positions and values given the exponent). enc / dec: GB/s, checked decode. thr: threads."
    )
    return rows


# --- section 2: today's code (a git revision) against this tree
_BASELINE_SCRIPT = """
import json, os, sys, time
from heterorl.weights import encode_patch, apply_patch
from heterorl.bench.pulse import synthetic_step
kind, workers = sys.argv[1], int(sys.argv[2])
rate = None if kind == "lr" else 0.03
base, new = synthetic_step(int(sys.argv[3]), rate, 1e-6, 0)
nbytes = 2 * sum(t.numel() for t in base.values())
def best(fn, reps=3):
    fn(); out = []
    for _ in range(reps):
        s = time.perf_counter(); fn(); out.append(time.perf_counter() - s)
    return min(out)
enc = best(lambda: encode_patch(base, new, workers=workers))
patch, back = encode_patch(base, new), encode_patch(new, base)
w = {k: v.clone() for k, v in base.items()}
dec = []
for _ in range(4):
    s = time.perf_counter(); apply_patch(w, patch, workers=workers); dec.append(time.perf_counter() - s)
    apply_patch(w, back, workers=workers)
print(json.dumps({"encode_GBps": nbytes / enc / 1e9, "decode_GBps": nbytes / min(dec[1:]) / 1e9,
                  "patch_bytes": len(patch), "load": os.getloadavg()[0]}))
"""


def _baseline_tree(rev: str) -> Path:
    """`src/heterorl` of revision `rev`, extracted to a temporary directory."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "src/heterorl"], check=True, capture_output=True
    ).stdout
    root = Path(tempfile.mkdtemp(prefix="pulse-baseline-"))
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    return root / "src"


def _run_baseline(src: Path, kind: str, workers: int, params: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run(
        [sys.executable, "-c", _BASELINE_SCRIPT, kind, str(workers), str(params)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def section_speed(quick: bool, workers: list[int], baseline: str | None, baseline_src: str | None) -> list[dict]:
    params = 4_000_000 if quick else 70_000_000
    print(f"\n== 2. Codec speed, synthetic {params / 1e6:.0f}M-parameter steps: before ({baseline}) vs after ==")
    src = Path(baseline_src) if baseline_src else (_baseline_tree(baseline) if baseline else None)
    header = (
        f"{'step':24s} {'thr':>3s} {'before enc':>10s} {'before dec':>10s} {'v1 enc':>7s} {'v1 dec':>7s} "
        f"{'v2 enc':>7s} {'v2 dec':>7s} {'copy':>5s} {'load':>5s}"
    )
    print(header + "\n" + "-" * len(header))
    rows = []
    for kind, label, kwargs in (
        ("rate", "3% of elements +-1 ULP", {"change_rate": 0.03}),
        ("lr", "lr 1e-6 sign step", {}),
    ):
        base, new = step_pair("synthetic", params, 1e-6, kwargs.get("change_rate"), 0)
        for i, w in enumerate(workers):
            before = _run_baseline(src, kind, w, params) if src else None
            r = measure(base, new, workers=w, verbose=False, bounds=False)
            c = r["ctx"]
            b_enc = f"{before['encode_GBps']:10.2f}" if before else f"{'-':>10s}"
            b_dec = f"{before['decode_GBps']:10.2f}" if before else f"{'-':>10s}"
            print(
                f"{label if i == 0 else '':24s} {w:3d} {b_enc} {b_dec} {r['encode_GBps']:7.2f} {r['decode_GBps']:7.2f} "
                f"{c['encode_GBps']:7.2f} {c['decode_GBps']:7.2f} {r['copy_GBps']:5.1f} {r['load_average'][3]:5.2f}",
                flush=True,
            )
            if before:
                assert before["patch_bytes"] == r["patch_bytes"], "v1 bytes changed against the baseline"
            rows.append({"step": label, "workers": w, "before": before, **r})
    print("GB/s of bf16 model bytes; decode = apply_patch with every check; v1 bytes are identical before and after.")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small models: a smoke run in about a minute")
    parser.add_argument("--contexts", action="store_true", help="entropy by candidate context (slow)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="thread counts to time")
    parser.add_argument("--baseline", default=BASELINE, help="git revision of 'before' ('' to skip)")
    parser.add_argument("--baseline-src", help="instead: a directory holding the baseline's heterorl package")
    parser.add_argument("--skip", nargs="*", default=[], choices=["realistic", "speed"])
    parser.add_argument("--kinds", nargs="+", default=["demo", "qwen3", "noise"], help="realistic steps to run")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args()
    start = time.time()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()}")
    out: dict = {}
    if "realistic" not in args.skip:
        out["realistic"] = section_realistic(args.quick, args.workers, args.contexts, args.kinds)
    if "speed" not in args.skip:
        out["speed"] = section_speed(args.quick, args.workers, args.baseline or None, args.baseline_src)
    print(f"\ndone in {time.time() - start:.0f} s, load average {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
