"""The live cluster over shaped WAN links, and how well the simulator predicts it (issues 23 and 24).

Real processes, real kernel TCP: `heterorl run --live` with `live.wan_lab: true` (docs/wan-lab.md) puts the learner
and each sampler in its own network namespace and shapes every packet of a sampler's link in user space (this
kernel has no sch_netem): one-way delay per direction, rate, a bounded bottleneck queue. Needs root.

    sudo .venv/bin/python benchmarks/wan_bench.py --out /tmp/wanbench --steps 40
    sudo .venv/bin/python benchmarks/wan_bench.py --out /tmp/wb --cases three-links four-links   # calibrated plan
    sudo .venv/bin/python benchmarks/wan_bench.py --out /tmp/ws --steps 200 --cases three-links-store three-links \
        --repeats 4 --no-predict                                  # store vs HTTP, interleaved (~9 min)
    .venv/bin/python benchmarks/wan_bench.py --out /tmp/wb-again --predict-again /tmp/wb   # saved runs, this code

Cases (configs/wanlab.yaml: the demo on links near 50 ms / 100 Mbit/s, far 300 ms / 20, remote 1 s / 5, one way):
- three-links: the three shaped links (`--repeats` times: the live spread);
- remote-alone: one sampler on the 1 s / 5 Mbit/s link (issue 23: at least 2 accepted groups/s);
- unshaped: the three samplers on unshaped links (still through the lab's router), the accuracy reference;
- four-links: a fourth sampler on a 500 ms / 10 Mbit/s link, the run a calibration must predict (issue 24);
- three-links-store: three-links with weights and rollouts through an S3 store (issue 23: within 1.5x of HTTP's
  trained groups/s): moto's server in the learner's namespace on the learner's lab address, so the learner reaches
  it locally and every sampler through its shaped link, as it reaches the learner's HTTP service. Each run gets a
  fresh server; its request log (OUT/moto/<label>.log) gives the requests by kind and its CPU seconds are read
  before it stops. `--s3-server keepalive` (the default) serves moto's application under waitress with HTTP/1.1
  keep-alive, as S3 does (benchmarks/s3_server.py); `werkzeug` is `moto_server` itself, which closes the
  connection after every request (a TCP handshake and slow start again per request). Not predicted by the
  simulator here (`--no-predict` is implied for it).
Repeated cases (three-links, three-links-store: `--repeats`) run interleaved, and store/HTTP ratios of trained
groups/s are printed for each pair of the same repeat.

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
import contextlib
import copy
import json
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from wan_measure import live_figures, run_figures

REPO = Path(__file__).resolve().parents[1]
BASE_CONFIG = REPO / "configs" / "wanlab.yaml"
LEARNER_IP = "10.77.0.1"  # WanLab's default subnet: the learner's address in every lab
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
    "three-links-store": (("near", "far", "remote"), True),
}
STORE_CASES = {"three-links-store": "three-links"}  # store case -> its HTTP twin
REPEATED = ("three-links", "three-links-store")
MOTO_PORT = 8471  # beside the learner's HTTP port (live.wan_lab_port, 8470) on the learner's lab address
MOTO_ENV = {  # moto's dummy credentials, in the environment only (the children inherit it)
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
BUCKET = "heterorl-wanbench"
MAKE_BUCKET = """
import sys, time, boto3, botocore.exceptions
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1")
for _ in range(300):
    try:
        s3.create_bucket(Bucket=sys.argv[2])
        break
    except botocore.exceptions.EndpointConnectionError:
        time.sleep(0.1)
else:
    sys.exit("moto's server did not answer within 30 s")
"""


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


def case_config(case: str, steps: int, store_poll: float | None = None) -> dict[str, Any]:
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
    if case in STORE_CASES:
        store: dict[str, Any] = {"url": f"s3://{BUCKET}/run", "endpoint_url": f"http://{LEARNER_IP}:{MOTO_PORT}"}
        if store_poll is not None:
            store["poll_seconds"] = store_poll
        cfg["transport"] = {"weights": "store", "rollouts": "store", "store": store}
    return cfg


class MotoInLab:
    """moto's S3 server in a lab's learner namespace for one live run (`run_live`'s `lab_services`): started on the
    learner's lab address with a fresh bucket before the children start; its CPU seconds read, then stopped, after
    they end. Its request log goes to `log`."""

    def __init__(self, log: Path, server: str) -> None:
        self.log, self.server, self.cpu_s = log, server, math.nan

    @contextlib.contextmanager
    def __call__(self, lab: Any) -> Iterator[None]:
        if lab.learner_ip != LEARNER_IP:  # the store's endpoint is in the config, written before the lab exists
            raise RuntimeError(f"the lab's learner is at {lab.learner_ip}, the config's store at {LEARNER_IP}")
        endpoint = f"http://{LEARNER_IP}:{MOTO_PORT}"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            argv = {
                "keepalive": [sys.executable, str(REPO / "benchmarks" / "s3_server.py"), LEARNER_IP, str(MOTO_PORT)],
                "werkzeug": [sys.executable, "-m", "moto.server", "-H", LEARNER_IP, "-p", str(MOTO_PORT)],
            }[self.server]
            proc = lab.popen("learner", argv, stdout=out, stderr=subprocess.STDOUT)
            try:
                made = lab.exec("learner", [sys.executable, "-c", MAKE_BUCKET, endpoint, BUCKET], timeout=60)
                if made.returncode != 0:
                    raise RuntimeError(f"moto's server in the lab: {made.stderr.strip()[-500:]}")
                yield
                self.cpu_s = process_cpu_s(proc.pid)
            finally:
                proc.terminate()
                proc.wait(timeout=10)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def moto_requests(log: Path) -> dict[str, int]:
    """Requests in moto's log by kind: LIST (GET with list-type), GET, PUT, DELETE, HEAD, POST; a GET or HEAD that
    found nothing (404: a reply not there yet) counts as `GET miss` / `HEAD miss`."""
    counts: dict[str, int] = {}
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))  # werkzeug colours its lines
    for m in re.finditer(r'"(GET|PUT|DELETE|HEAD|POST) (\S+) HTTP/[0-9.]+" (\d+)', text):
        kind = "LIST" if m[1] == "GET" and "list-type" in m[2] else m[1]
        kind += " miss" if m[3] == "404" else ""
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def live_run(label: str, case: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One live run of `case` in a fresh WAN lab; its figures."""
    from heterorl.config import RunConfig
    from heterorl.live.launcher import run_live

    cfg = case_config(case, args.steps, args.store_poll)
    run_dir = out / "runs" / label
    moto = MotoInLab(out / "moto" / f"{label}.log", args.s3_server) if case in STORE_CASES else None
    began = time.monotonic()
    with LoadSampler() as load:
        run_live(RunConfig.model_validate(cfg), run_dir, show_progress=True, lab_services=moto)
    names = [s["name"] for s in cfg["cluster"]["samplers"]]
    record = {
        "label": label,
        "case": case,
        "clock": "live",
        "config": cfg,
        "wall_s": time.monotonic() - began,
        "load": load.summary(),
        **live_figures(run_dir, names),
    }
    if moto is not None:
        record["store"] = {"server": args.s3_server, "server_cpu_s": moto.cpu_s, "requests": moto_requests(moto.log)}
    return record


def measured_config(live: dict[str, Any]) -> dict[str, Any]:
    """The live run's config for the simulator with what that run measured: each sampler's generation speed and
    start time, the learner's busy seconds per step (no per-token part: a step's tokens vary little here), its
    intake's seconds per uploaded group (the replies' `handled`) and its commit's seconds per step and per
    evaluation (the `trained` events' `commit_seconds`)."""
    cfg = copy.deepcopy(live["config"])
    cfg["live"]["wan_lab"] = False
    speeds = [s["tokens_per_s"] for s in live["samplers"].values() if s["tokens_per_s"]]
    for s in cfg["cluster"]["samplers"]:
        got = live["samplers"][s["name"]]
        s["tokens_per_second"] = got["tokens_per_s"] or statistics.fmean(speeds)  # one without a summary: the mean
        s["start_delay_s"] = round(max(got["started_s"] or 0.0, 0.0), 3)
    cfg["cluster"]["learner_step_seconds"] = live["learner_step_seconds"]
    cfg["cluster"]["learner_seconds_per_token"] = 0.0
    if cfg.get("transport", {}).get("rollouts", "http") != "store":
        cfg["cluster"]["learner_seconds_per_group"] = round(live.get("intake_s_per_group", 0.0), 6)
    cfg["cluster"]["learner_commit_seconds"] = round(live.get("commit_s", 0.0), 6)
    cfg["cluster"]["learner_eval_seconds"] = round(live.get("eval_s", 0.0), 6)
    return cfg


def calibrated_config(source: Path, target: dict[str, Any], into: Path | None = None) -> dict[str, Any]:
    """`heterorl calibrate` on the live run in `source` (its config written under `into`, by default beside the
    run's results), for the samplers and steps of the live run `target` (a sampler the calibration never saw keeps
    its link numbers, at the mean calibrated speed)."""
    from heterorl.calibrate import calibrate

    into = into if into is not None else source.parent.parent
    _, path = calibrate(source, into / "calibrated" / f"{source.name}.yaml")
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
        + (store_text(r["store"], w["steps"]) if "store" in r else "")
    )


def store_text(store: dict[str, Any], steps: int) -> str:
    requests = ", ".join(f"{k} {v} ({v / steps:.1f}/step)" for k, v in sorted(store["requests"].items()))
    return f"; S3 server ({store['server']}) {store['server_cpu_s']:.1f} CPU s, requests {requests}"


def store_ratios(results: list[dict[str, Any]]) -> list[str]:
    """store / HTTP trained groups/s for each store run and the HTTP run of its twin case in the same repeat."""
    live = {r["label"]: r for r in results if r["clock"] == "live"}
    lines = []
    for label, r in live.items():
        twin = STORE_CASES.get(r["case"])
        http = live.get(twin + label.removeprefix(r["case"])) if twin else None
        if http is not None:
            sw, hw = r["window"]["trained_per_s"], http["window"]["trained_per_s"]
            lines.append(
                f"{label} / {http['label']}: trained groups/s {sw:.2f} / {hw:.2f} = {ratio(sw, hw):.2f}x (HTTP "
                f"{ratio(hw, sw):.2f}x the store's); load median {r['load']['median']:.1f} / "
                f"{http['load']['median']:.1f}"
            )
    return lines


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
    ratios = store_ratios(results)
    if ratios:
        rows += ["", "## Store against HTTP (same case, same repeat)", ""] + [f"- {line}" for line in ratios]
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
    """(label, case) of every live run, in order: repeated cases (`REPEATED`) `repeats` times, interleaved."""
    return [
        (case + (f"-{k + 1}" if repeats > 1 and case in REPEATED else ""), case)
        for k in range(repeats)
        for case in cases
        if case in REPEATED or k == 0
    ]


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
    shown: set[str] = set()
    print(f"{len(runs)} live runs of {args.steps} steps into {out}; load {os.getloadavg()[0]:.2f}", flush=True)
    for i, (label, case) in enumerate(runs, 1):
        print(f"[{i}/{len(runs)}] {label}: live, {len(CASES[case][0])} samplers in the WAN lab", flush=True)
        live = live_run(label, case, out, args)
        save(out, live)
        results.append(live)
        print("  " + live_line(live), flush=True)
        for line in store_ratios(results):  # a pair's ratio once both runs are done
            if line not in shown:
                shown.add(line)
                print("  " + line, flush=True)
        if args.no_predict or not predicted(case):
            continue
        if case == "three-links" and calibration_source is None:
            calibration_source = out / "runs" / label
        results += predict(live, calibration_source, out)
    return results


def predicted(case: str) -> bool:
    """The simulator predicts the shaped cases, not the store's (its store is not the lab's S3 server)."""
    return CASES[case][1] and case not in STORE_CASES


def predict(
    live: dict[str, Any], calibration_source: Path | None, out: Path, into: Path | None = None
) -> list[dict[str, Any]]:
    """The simulator's predictions of the live run `live` (measured; calibrated on `calibration_source` when
    there is one, its config under `into`), simulated into `out` and saved there."""
    predictions = [("measured", measured_config(live))]
    if calibration_source is not None:
        predictions.append(("calibrated", calibrated_config(calibration_source, live, into)))
    sims = []
    for kind, cfg in predictions:
        print(f"  simulating {live['label']} ({kind})", flush=True)
        sim = simulate(f"{live['label']}-sim-{kind}", cfg, live, out)
        save(out, sim)
        sims.append(sim)
        print("  " + sim_line(sim), flush=True)
    return sims


def predict_again(source: Path, out: Path) -> list[dict[str, Any]]:
    """The predictions of the live runs saved in `source` (an earlier `--out`), made again with this code into
    `out`: calibrated on the first three-links run, as the live pass did. No lab, no root."""
    lives = [json.loads(p.read_text()) for p in sorted((source / "results").glob("*.json"))]
    lives = [r for r in lives if r.get("clock") == "live" and r.get("case") in CASES and predicted(r["case"])]
    if not lives:
        sys.exit(f"error: {source}/results holds no shaped live run to predict")
    three = sorted(r["label"] for r in lives if r["case"] == "three-links")
    calibration_source = source / "runs" / three[0] if three else None
    results: list[dict[str, Any]] = []
    for live in lives:
        results += [live, *predict(live, calibration_source, out, into=out)]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="Results directory (runs/, results/, summary.md).")
    parser.add_argument("--cases", nargs="+", default=["three-links"], choices=list(CASES))
    parser.add_argument(
        "--repeats", type=int, default=1, help="Runs of three-links and three-links-store, interleaved (the spread)."
    )
    parser.add_argument("--steps", type=int, default=40, help="Learner steps of every run.")
    parser.add_argument(
        "--s3-server",
        choices=["keepalive", "werkzeug"],
        default="keepalive",
        help="Store cases: moto under waitress (keep-alive, as S3) or moto_server (a connection per request).",
    )
    parser.add_argument(
        "--store-poll", type=float, help="Store cases: transport.store.poll_seconds (the longest wait between looks)."
    )
    parser.add_argument("--no-predict", action="store_true", help="Live runs only, no simulated predictions.")
    parser.add_argument(
        "--predict-again",
        type=Path,
        metavar="FROM",
        help="No live runs: predict the live runs saved in FROM (an earlier --out) again with this code (no root).",
    )
    args = parser.parse_args()
    out = args.out.resolve()
    if args.predict_again is not None:
        if (out / "runs").exists():
            sys.exit(f"error: {out}/runs exists: remove it or choose another --out")
        text = tables(predict_again(args.predict_again.resolve(), out))
        print(text)
        (out / "summary.md").write_text(text + "\n")
        return
    if os.geteuid() != 0:
        sys.exit("error: the WAN lab needs root (network namespaces and TUN devices): run it with sudo")
    if args.steps < 3 or args.repeats < 1:
        sys.exit("error: --steps must be at least 3 (a rate needs two steps after the first) and --repeats >= 1")
    if (out / "runs").exists():
        sys.exit(f"error: {out}/runs exists: remove it or choose another --out")
    from heterorl.lab.netns import remove_stale

    if any(c in STORE_CASES for c in args.cases):
        os.environ.update(MOTO_ENV)

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
