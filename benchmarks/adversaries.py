"""Issue 25's table from a finished `heterorl sweep sweeps/adversaries.yaml`: per adversary kind (one of four
samplers, `s3`, lying) and defences on / off, the share of the liar's groups the learner refused, the false-positive
rate on the honest samplers, and held-out accuracy after the last step, mean +- sd over seeds, against the
all-honest runs with the same defences.

    .venv/bin/heterorl sweep sweeps/adversaries.yaml            # 36 runs (6 kinds x on/off x 3 seeds)
    .venv/bin/heterorl sweep sweeps/adversaries-poison.yaml    # 12 runs: the poison on GRPO
    .venv/bin/python benchmarks/adversaries.py runs/adversaries runs/adversaries-poison

From each run directory: config.yaml (which adversary, which defences), summary.json (`trust`: every sampler's
record, `accuracy_final`; `per_sampler`: the liar's share of the trained groups) and metrics.jsonl (the step at
which the liar was quarantined). Caught = the liar's groups refused for a charged reason, dropped from a step as
poison, or refused while quarantined, over all its groups that reached the learner; a false positive = an honest
sampler's group charged the same way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from heterorl.loop.reputation import CHARGED
from heterorl.metrics import read_metrics

LIAR = "s3"
CAUGHT = CHARGED | {"quarantined"}


def caught_and_sent(record: dict) -> tuple[int, int]:
    """(groups refused or dropped for a charged reason or quarantine, groups that reached the learner)."""
    refused = record["refused"]
    caught = sum(n for reason, n in refused.items() if reason in CAUGHT)
    sent = record["accepted"] + sum(n for reason, n in refused.items() if reason != "poisoned")
    return caught, sent


def quarantined_at(run: Path) -> int | None:
    for rec in read_metrics(run / "metrics.jsonl"):
        if rec.get("kind") == "train" and rec.get(f"trust/{LIAR}/quarantined") == 1.0:
            return int(rec["step"])
    return None


def last_eval(run: Path) -> tuple[int, float]:
    """(step, held-out accuracy) of the last evaluation in metrics.jsonl."""
    evals = [r for r in read_metrics(run / "metrics.jsonl") if r.get("kind") == "eval"]
    return int(evals[-1]["step"]), float(evals[-1]["eval/accuracy"])


def one_run(run: Path) -> dict | None:
    """One run's row; a run that failed (TrainingDivergedError: no summary.json) keeps its last evaluation."""
    if not (run / "config.yaml").is_file() or not (run / "metrics.jsonl").is_file():
        return None
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    summary_path = run / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    step, accuracy = last_eval(run)
    liar = cfg.get("adversaries", {}).get(LIAR)
    trust = cfg["trust"]
    on = trust["recheck_rewards"] or trust["verify"]["fraction"] > 0
    records = summary.get("trust", {})
    honest = [records[n] for n in records if n != LIAR] + ([records[LIAR]] if liar is None and LIAR in records else [])
    fp = [caught_and_sent(r) for r in honest]
    objective = cfg["objective"]["name"]
    kind = "none" if liar is None else liar["kind"]
    out = {
        "kind": kind if objective == "gepo" else f"{kind} ({objective})",
        "defences": "on" if on else "off",
        "seed": cfg["seed"],
        "accuracy": summary.get("accuracy_final", accuracy),
        "stopped_at": None if summary else step,
        "false_positive": sum(c for c, _ in fp) / max(1, sum(s for _, s in fp)),
        "honest_charged": sum(c for c, _ in fp),
    }
    if liar is not None and LIAR in records:
        caught, sent = caught_and_sent(records[LIAR])
        out.update(caught=caught / max(1, sent), liar_sent=sent, quarantined_at=quarantined_at(run))
        trained = summary.get("per_sampler", {}).get(LIAR, {}).get("trained_share")
        if trained is not None:  # a quarantined liar stops sending: few groups, so "caught" alone understates it
            out["liar_trained"] = trained
    return out


def fmt(values: list[float], pct: bool = True) -> str:
    if not values:
        return "-"
    scale = 100.0 if pct else 1.0
    mean = statistics.mean(values) * scale
    if len(values) == 1:
        return f"{mean:.1f}"
    return f"{mean:.1f} ± {statistics.stdev(values) * scale:.1f}"


def table(rows: list[dict]) -> str:
    by = defaultdict(list)
    for r in rows:
        by[(r["kind"], r["defences"])].append(r)
    kinds = ["none", "forged_logprobs", "poison", "other_model", "forged_rewards", "replay", "none (grpo)"]
    kinds.append("poison (grpo)")
    lines = [
        "| adversary (1 of 4) | defences | liar's groups caught % | quarantined at step "
        "| liar's share of trained groups % | honest false positives % | held-out accuracy % (last evaluation) "
        "| vs all-honest (points) | seeds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind in [k for k in kinds if any(key[0] == k for key in by)] + sorted({k for k, _ in by} - set(kinds)):
        for defences in ("on", "off"):
            runs = by.get((kind, defences))
            if not runs:
                continue
            baseline = "none" if "(" not in kind else "none " + kind[kind.index("(") :]
            honest = {r["seed"]: r["accuracy"] for r in by.get((baseline, defences), [])}
            deltas = [r["accuracy"] - honest[r["seed"]] for r in runs if r["seed"] in honest]
            q = [r["quarantined_at"] for r in runs if r.get("quarantined_at") is not None]
            stopped = [r["stopped_at"] for r in runs if r["stopped_at"] is not None]
            note = f" (stopped: {len(stopped)} of {len(runs)} runs, at steps {stopped})" if stopped else ""
            lines.append(
                f"| {kind} | {defences} | {fmt([r['caught'] for r in runs if 'caught' in r])} "
                f"| {fmt(q, pct=False) if q else '-'} ({len(q)}/{len(runs)}) "
                f"| {fmt([r['liar_trained'] for r in runs if 'liar_trained' in r])} "
                f"| {fmt([r['false_positive'] for r in runs])} | {fmt([r['accuracy'] for r in runs])}{note} "
                f"| {fmt(deltas) if not kind.startswith('none') else '-'} | {len(runs)} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep_dir", type=Path, help="the sweep's output directory (runs/adversaries)")
    parser.add_argument("more", type=Path, nargs="*", help="other sweeps' directories (runs/adversaries-poison)")
    parser.add_argument("--json", type=Path, help="also write every run's row here")
    args = parser.parse_args()
    rows = []
    for sweep_dir in [args.sweep_dir, *args.more]:
        status = {r["name"]: r["status"] for r in json.loads((sweep_dir / "sweep.json").read_text())["runs"]}
        finished = [run for run in sorted(sweep_dir.iterdir()) if status.get(run.name) in ("done", "skipped", "failed")]
        rows += [r for run in finished if (r := one_run(run)) is not None]
    if not rows:
        sys.exit(f"no finished runs under {args.sweep_dir}")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
