"""The live cluster over shaped WAN links, and how well the simulator predicts it (issues 23 and 24).

Real processes, real kernel TCP: `heterorl run --live` with `live.wan_lab: true` (docs/wan-lab.md) puts the learner
and each sampler in its own network namespace and shapes every packet of a sampler's link in user space (this
kernel has no sch_netem): one-way delay per direction, rate, a bounded bottleneck queue. Needs root.

    sudo .venv/bin/python benchmarks/wan_bench.py --out /tmp/wanbench --steps 40
    sudo .venv/bin/python benchmarks/wan_bench.py --out /tmp/wb --cases three-links four-links   # calibrated plan

Cases (configs/wanlab.yaml: the demo on links near 50 ms / 100 Mbit/s, far 300 ms / 20, remote 1 s / 5, one way):
- three-links: the three shaped links (`--repeats` times: the live spread);
- remote-alone: one sampler on the 1 s / 5 Mbit/s link (issue 23: at least 2 accepted groups/s);
- unshaped: the three samplers on unshaped links (still through the lab's router), the accuracy reference;
- four-links: a fourth sampler on a 500 ms / 10 Mbit/s link, the run a calibration must predict (issue 24).

Each shaped live run is followed by the simulator's predictions of it, run on the same seed and steps:
- `measured`: the config's link numbers with what the live run measured (each sampler's tokens per busy second
  and start time, the learner's busy seconds per step): how issues 23 and 24 state the uncalibrated prediction;
- `calibrated`: the config `heterorl calibrate` writes from the first three-links run (measured delays, rates,
  speeds, learner cost, start-up). On that same run it is an in-sample fit; on four-links it predicts a sampler it
  never saw (the extra sampler is added with its link numbers and the mean measured speed).
Every figure is printed with the ratio simulated / live in the same run, and the load average (2 cores, shared:
CPU contention slows generation and training live; the measured speeds carry it into the simulator).

Results: OUT/results/<label>.json per run, run directories under OUT/runs/, the tables on stdout and in
OUT/summary.md. The lab's namespaces are deleted on exit, and any this process left are removed at the end (as
`heterorl lab clean` does for labs whose process is gone).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from wan_measure import live_figures, run_figures

REPO = Path(__file__).resolve().parents[1]
BASE_CONFIG = REPO / "configs" / "wanlab.yaml"
EXTRA = {  # the fourth sampler of `four-links`
    "name": "extra",
    "tokens_per_second": 2.0,
    "link": {
        "weights_delay": {"kind": "fixed", "seconds": 0.5},
        "rollout_delay": {"kind": "fixed", "seconds": 0.5},
        "bandwidth_mbps": 10,
        "transfer": {"model": "tcp"},
    },
}
CASES = {  # case -> (samplers, shaped)
    "three-links": (("near", "far", "remote"), True),
    "remote-alone": (("remote",), True),
    "unshaped": (("near", "far", "remote"), False),
    "four-links": (("near", "far", "remote", "extra"), True),
}


class LoadSampler:
    """The 1-minute load average every `every` seconds in a thread, while a run lasts."""

    def __init__(self, every: float = 10.0) -> None:
        self.every, self.values = every, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.values.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.values.append(os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        return {"median": statistics.median(self.values), "min": min(self.values), "max": max(self.values)}


def case_config(case: str, steps: int) -> dict[str, Any]:
    """configs/wanlab.yaml with the case's samplers and steps, run live in the WAN lab."""
    names, shaped = CASES[case]
    base = yaml.safe_load(BASE_CONFIG.read_text())
    by_name = {s["name"]: s for s in base["cluster"]["samplers"]} | {"extra": EXTRA}
    cfg = copy.deepcopy(base)
    cfg["learner"]["steps"] = steps
    cfg["cluster"]["samplers"] = [copy.deepcopy(by_name[n]) for n in names]
    if not shaped:
        for s in cfg["cluster"]["samplers"]:
            s["link"] = {}
    cfg.setdefault("live", {})["wan_lab"] = True
    return cfg


def live_run(label: str, case: str, steps: int, out: Path) -> dict[str, Any]:
    """One live run of `case` in a fresh WAN lab; its figures."""
    from heterorl.config import RunConfig
    from heterorl.live.launcher import run_live

    cfg = case_config(case, steps)
    run_dir = out / "runs" / label
    began = time.monotonic()
    with LoadSampler() as load:
        run_live(RunConfig.model_validate(cfg), run_dir, show_progress=True)
    names = [s["name"] for s in cfg["cluster"]["samplers"]]
    return {
        "label": label,
        "case": case,
        "clock": "live",
        "config": cfg,
        "wall_s": time.monotonic() - began,
        "load": load.summary(),
        **live_figures(run_dir, names),
    }


def measured_config(live: dict[str, Any]) -> dict[str, Any]:
    """The live run's config for the simulator with what that run measured: each sampler's generation speed and
    start time, the learner's busy seconds per step (no per-token part: a step's tokens vary little here)."""
    cfg = copy.deepcopy(live["config"])
    cfg["live"]["wan_lab"] = False
    speeds = [s["tokens_per_s"] for s in live["samplers"].values() if s["tokens_per_s"]]
    for s in cfg["cluster"]["samplers"]:
        got = live["samplers"][s["name"]]
        s["tokens_per_second"] = got["tokens_per_s"] or statistics.fmean(speeds)  # one without a summary: the mean
        s["start_delay_s"] = round(max(got["started_s"] or 0.0, 0.0), 3)
    cfg["cluster"]["learner_step_seconds"] = live["learner_step_seconds"]
    cfg["cluster"]["learner_seconds_per_token"] = 0.0
    return cfg


def calibrated_config(source: Path, target: dict[str, Any]) -> dict[str, Any]:
    """`heterorl calibrate` on the live run in `source`, for the samplers and steps of the live run `target`
    (a sampler the calibration never saw keeps its link numbers, at the mean calibrated speed)."""
    from heterorl.calibrate import calibrate

    _, path = calibrate(source, source.parent.parent / "calibrated" / f"{source.name}.yaml")
    cfg = yaml.safe_load(path.read_text())
    known = {s["name"]: s for s in cfg["cluster"]["samplers"]}
    speeds = [s["tokens_per_second"] for s in known.values()]
    mean_speed = statistics.fmean(speeds)
    cfg["cluster"]["samplers"] = [
        known.get(s["name"]) or {**copy.deepcopy(s), "tokens_per_second": mean_speed}
        for s in target["config"]["cluster"]["samplers"]
    ]
    cfg["learner"]["steps"] = target["config"]["learner"]["steps"]
    return cfg


def simulate(label: str, cfg: dict[str, Any], live: dict[str, Any], out: Path) -> dict[str, Any]:
    """The simulated run of `cfg` and its figures against the live run `live`."""
    from heterorl.config import RunConfig
    from heterorl.simulated.run import execute

    run_dir = out / "runs" / label
    began = time.monotonic()
    execute(RunConfig.model_validate(cfg), run_dir, show_progress=True)
    sim = {"label": label, "clock": "simulated", "live": live["label"], "config": cfg, **run_figures(run_dir)}
    sim["wall_s"] = time.monotonic() - began
    sim["compare"] = compare(live, sim)
    return sim


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def compare(live: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    """Simulated against live: ratios (sim / live) for throughput and mean staleness, differences for p90
    (steps), idle share and trained shares (points)."""
    lw, sw, ls, ss = live["window"], sim["window"], live["staleness"], sim["staleness"]
    names = sorted(set(live["shares"]) | set(sim["shares"]))
    return {
        "throughput_ratio": ratio(sw["trained_per_s"], lw["trained_per_s"]),
        "whole_throughput_ratio": ratio(sw["whole_trained_per_s"], lw["whole_trained_per_s"]),
        "staleness_mean_ratio": ratio(ss["mean"], ls["mean"]),
        "p90_difference": ss["p90"] - ls["p90"],
        "idle_points": 100 * (sw["idle"] - lw["idle"]),
        "share_points": {n: 100 * (sim["shares"].get(n, 0.0) - live["shares"].get(n, 0.0)) for n in names},
    }


# ---------------------------------------------------------------------- tables
def live_line(r: dict[str, Any]) -> str:
    w, s, load = r["window"], r["staleness"], r["load"]
    per = ", ".join(f"{n} {x['accepted_per_s']:.2f}" for n, x in r["samplers"].items())
    return (
        f"{r['label']}: trained {w['trained_per_s']:.2f} groups/s (whole run {w['whole_trained_per_s']:.2f}), learner "
        f"idle {w['idle']:.0%}; accepted groups/s {per}; staleness mean {s['mean']:.2f} p90 {s['p90']:.0f} max "
        f"{s['max']:.0f}; accuracy {r['accuracy_final']:.3f}; {r['wall_s']:.0f} s wall, load median "
        f"{load['median']:.1f} (min {load['min']:.1f}, max {load['max']:.1f}) on {os.cpu_count()} CPUs"
    )


def sim_line(r: dict[str, Any]) -> str:
    w, s, c = r["window"], r["staleness"], r["compare"]
    shares = ", ".join(f"{n} {p:+.1f}" for n, p in c["share_points"].items())
    return (
        f"{r['label']}: trained {w['trained_per_s']:.2f} groups/s, idle {w['idle']:.0%}, staleness mean "
        f"{s['mean']:.2f} p90 {s['p90']:.0f}; sim/live throughput {c['throughput_ratio']:.2f}x (whole run "
        f"{c['whole_throughput_ratio']:.2f}x), mean staleness {c['staleness_mean_ratio']:.2f}x, p90 "
        f"{c['p90_difference']:+.0f} steps, idle {c['idle_points']:+.0f} points, shares (points) {shares}"
    )


def tables(results: list[dict[str, Any]]) -> str:
    live = [r for r in results if r["clock"] == "live"]
    sims = [r for r in results if r["clock"] == "simulated"]
    names = sorted({n for r in live for n in r["samplers"]}, key=["near", "far", "remote", "extra"].index)
    rows = [
        "## Live runs in the WAN lab",
        "",
        "| run | trained groups/s (whole run) | learner idle | accepted groups/s "
        + " / ".join(names)
        + " | staleness mean / p90 / max | accuracy | wall s | load median (max) |",
        "| --- | ---: | ---: | --- | --- | ---: | ---: | ---: |",
    ]
    for r in live:
        w, s = r["window"], r["staleness"]
        per = " / ".join(f"{r['samplers'][n]['accepted_per_s']:.2f}" if n in r["samplers"] else "-" for n in names)
        rows.append(
            f"| {r['label']} | {w['trained_per_s']:.2f} ({w['whole_trained_per_s']:.2f}) | {w['idle']:.0%} | {per} "
            f"| {s['mean']:.2f} / {s['p90']:.0f} / {s['max']:.0f} | {r['accuracy_final']:.3f} | {r['wall_s']:.0f} "
            f"| {r['load']['median']:.1f} ({r['load']['max']:.1f}) |"
        )
    if sims:
        rows += [
            "",
            "## The simulator against the live runs (ratio = simulated / live)",
            "",
            "| prediction | of live run | groups/s sim (ratio; whole run) | idle sim (points) | staleness mean sim "
            "(ratio) | p90 sim (difference) | shares (points) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in sims:
            w, s, c = r["window"], r["staleness"], r["compare"]
            shares = ", ".join(f"{n} {p:+.1f}" for n, p in c["share_points"].items())
            rows.append(
                f"| {r['label']} | {r['live']} | {w['trained_per_s']:.2f} ({c['throughput_ratio']:.2f}x; "
                f"{c['whole_throughput_ratio']:.2f}x) | {w['idle']:.0%} ({c['idle_points']:+.0f}) | {s['mean']:.2f} "
                f"({c['staleness_mean_ratio']:.2f}x) | {s['p90']:.0f} ({c['p90_difference']:+.0f}) | {shares} |"
            )
    return "\n".join(rows)


# ---------------------------------------------------------------------- main
def save(out: Path, record: dict[str, Any]) -> None:
    path = out / "results" / f"{record['label']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=float))


def plan(cases: list[str], repeats: int) -> list[tuple[str, str]]:
    """(label, case) of every live run, in order."""
    runs = []
    for case in cases:
        n = repeats if case == "three-links" else 1
        runs += [(case + (f"-{k + 1}" if n > 1 else ""), case) for k in range(n)]
    return runs


def leftover_namespaces() -> list[str]:
    """Delete the lab namespaces this process made that are still there; their names."""
    from heterorl.lab.netns import delete_netns, lab_namespaces

    mine = [n for n in lab_namespaces() if n.startswith(f"hrl-{os.getpid()}-")]
    for name in mine:
        delete_netns(name)
    return mine


def run(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    calibration_source: Path | None = None
    runs = plan(args.cases, args.repeats)
    print(f"{len(runs)} live runs of {args.steps} steps into {out}; load {os.getloadavg()[0]:.2f}", flush=True)
    for i, (label, case) in enumerate(runs, 1):
        print(f"[{i}/{len(runs)}] {label}: live, {len(CASES[case][0])} samplers in the WAN lab", flush=True)
        live = live_run(label, case, args.steps, out)
        save(out, live)
        results.append(live)
        print("  " + live_line(live), flush=True)
        if not CASES[case][1] or args.no_predict:
            continue
        predictions = [("measured", measured_config(live))]
        if case == "three-links" and calibration_source is None:
            calibration_source = out / "runs" / label
        if calibration_source is not None:
            predictions.append(("calibrated", calibrated_config(calibration_source, live)))
        for kind, cfg in predictions:
            print(f"  simulating {label} ({kind})", flush=True)
            sim = simulate(f"{label}-sim-{kind}", cfg, live, out)
            save(out, sim)
            results.append(sim)
            print("  " + sim_line(sim), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="Results directory (runs/, results/, summary.md).")
    parser.add_argument("--cases", nargs="+", default=["three-links"], choices=list(CASES))
    parser.add_argument("--repeats", type=int, default=1, help="three-links live runs (the live spread).")
    parser.add_argument("--steps", type=int, default=40, help="Learner steps of every run.")
    parser.add_argument("--no-predict", action="store_true", help="Live runs only, no simulated predictions.")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("error: the WAN lab needs root (network namespaces and TUN devices): run it with sudo")
    if args.steps < 3 or args.repeats < 1:
        sys.exit("error: --steps must be at least 3 (a rate needs two steps after the first) and --repeats >= 1")
    out = args.out.resolve()
    if (out / "runs").exists():
        sys.exit(f"error: {out}/runs exists: remove it or choose another --out")
    from heterorl.lab.netns import remove_stale

    stale = remove_stale()
    if stale:
        print(f"removed {len(stale)} namespaces left by labs whose process is gone: {' '.join(stale)}", flush=True)
    try:
        results = run(args, out)
    finally:
        left = leftover_namespaces()
        print(f"lab namespaces left by this run: {' '.join(left) + ' (deleted)' if left else 'none'}", flush=True)
    text = tables(results)
    print(text)
    (out / "summary.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
