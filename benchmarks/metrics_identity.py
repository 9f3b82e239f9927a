"""Same results before and after: run configs at a base revision and at the working tree, compare metrics.jsonl.

    .venv/bin/python benchmarks/metrics_identity.py                       # demo + smoke, base = main
    .venv/bin/python benchmarks/metrics_identity.py --base b03d97d configs/smoke.yaml --set learner.steps=10

The base revision's `src/` is exported with `git archive` into a temporary directory and run from there (same
interpreter, same cached warm start); the working tree runs from `src/`. Records must be equal apart from the
`time/wall*` keys (real seconds); summary.json apart from its wall-clock fields. Prints each run's wall and CPU
seconds (the demo's wall time before/after) and exits 1 when any run differs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WALL_SUMMARY = ("wall_seconds", "rl_wall_seconds")


def export_src(rev: str, into: Path) -> Path:
    """`rev`'s src/ tree under `into`."""
    archive = into / "src.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(REPO), "archive", rev, "src"], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def run(src: Path, config: Path, overrides: list[str], run_dir: Path) -> tuple[float, float]:
    """`heterorl run` with `src` first on the path; (wall, CPU) seconds of the child."""
    cmd = [sys.executable, "-m", "heterorl.cli", "run", str(config), "--run-dir", str(run_dir)]
    cmd += [a for o in overrides for a in ("--set", o)]
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"run of {config} from {src} failed:\n{done.stderr[-3000:]}")
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/wall")} for line in lines]


def summary(run_dir: Path) -> dict[str, Any]:
    data = json.loads((run_dir / "summary.json").read_text())
    return {k: v for k, v in data.items() if k not in WALL_SUMMARY}


def first_difference(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> str:
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} records"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            keys = sorted(k for k in x.keys() | y.keys() if x.get(k) != y.get(k))
            return f"record {i}: " + ", ".join(f"{k} {x.get(k)} vs {y.get(k)}" for k in keys[:4])
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "configs", nargs="*", type=Path, default=[REPO / "configs" / "demo.yaml", REPO / "configs" / "smoke.yaml"]
    )
    parser.add_argument("--base", default="main", help="git revision to compare the working tree with")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="dotted.key=value, both runs")
    args = parser.parse_args()
    failed = False
    with tempfile.TemporaryDirectory(prefix="heterorl-identity-") as tmp:
        base_src = export_src(args.base, Path(tmp))
        for config in args.configs:
            name = config.stem
            base_dir, new_dir = Path(tmp) / f"{name}-base", Path(tmp) / f"{name}-new"
            base_wall, base_cpu = run(base_src, config, args.overrides, base_dir)
            new_wall, new_cpu = run(REPO / "src", config, args.overrides, new_dir)
            diff = first_difference(records(base_dir), records(new_dir))
            same_summary = summary(base_dir) == summary(new_dir)
            failed |= bool(diff) or not same_summary
            verdict = "identical" if not diff else f"DIFFERENT ({diff})"
            print(
                f"{name}: metrics.jsonl {verdict} ({len(records(new_dir))} records, time/wall* aside); summary.json "
                f"{'identical' if same_summary else 'DIFFERENT'}; wall {base_wall:.1f} s -> {new_wall:.1f} s "
                f"({base_wall / new_wall:.2f}x), CPU {base_cpu:.1f} s -> {new_cpu:.1f} s ({base_cpu / new_cpu:.2f}x) "
                f"[{args.base} -> working tree; load {os.getloadavg()[0]:.1f}]"
            )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
