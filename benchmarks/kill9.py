"""kill -9 the live learner at chosen points, resume it, and check that no acknowledged group was lost or trained
twice.

Each scenario runs a learner and two samplers as processes on loopback (a tiny random model, async mode,
`live.checkpoint_every` 3), kills the learner with SIGKILL (from outside after some steps, or at a named crash
point: `heterorl.failpoints`), restarts it with --resume while the samplers keep retrying, and lets the run
finish. Then, from the samplers' logs (what was acknowledged), the learner's `trained` events (which groups made
each version; a resumed life's records replace the redone steps') and the final state (what is consumed or
queued):

- lost: acknowledged groups neither consumed (trained or dropped by the window) nor queued at the end;
- trained twice: groups in two steps of the final history;
- records: metrics.jsonl must hold steps 1..S once each.

    python benchmarks/kill9.py                  # every scenario
    python benchmarks/kill9.py --only state.written:2
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

from heterorl.config import ModelConfig, config_to_yaml, load_config
from heterorl.durable.state import latest_state, read_records
from heterorl.eventlog import read_events
from heterorl.failpoints import ENV
from heterorl.metrics import read_metrics
from heterorl.policy import Policy
from heterorl.rollout_codec import GroupLimits, decode_group

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
STEPS = 10
TOKEN = "kill9-benchmark-token-" + "k" * 16
REWARD = "def length(prompt, completion, answer, **info):\n    return float(len(completion))\n"
# (name, failpoint or None for an outside kill, steps to wait for before an outside kill)
SCENARIOS = [
    ("outside, before the first periodic checkpoint", None, 2),
    ("journal.appended:10 (journaled, not yet answered)", "journal.appended:10", 0),
    ("checkpoint.rotated:2 (new journal segment, no state yet)", "checkpoint.rotated:2", 0),
    ("state.written:2 (state complete, not renamed)", "state.written:2", 0),
    ("state.renamed:2 (two states, journal not pruned)", "state.renamed:2", 0),
    ("step.trained:5 (trained in memory, not published)", "step.trained:5", 0),
    ("step.committed:5 (published and recorded, no state)", "step.committed:5", 0),
    ("outside, mid-run", None, 7),
]


def status(url: str) -> dict:
    try:
        with urllib.request.urlopen(url + "/v1/status", timeout=2) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return {}


def wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def scenario(work: Path, model: Path, failpoint: str | None, kill_after_steps: int) -> dict:
    cfg = load_config(
        None,
        [
            f"model.path={model}",
            "task.name=addition",
            "task.digits=1",
            "task.reward=heterorl_kill9_reward:length",
            "sampler.group_size=4",
            "sampler.max_new_tokens=3",
            f"learner.steps={STEPS}",
            "learner.groups_per_step=4",
            "cluster.mode=async",
            "cluster.samplers=[{name: a, link: {rollout_delay: {kind: fixed, seconds: 0.05}}}, {name: b}]",
            "live.emulate_links=true",
            "live.checkpoint_every=3",
            "live.poll_seconds=1",
            "live.backoff_initial_s=0.05",
            "live.backoff_max_s=0.5",
            "eval.every=100",
            "task.eval_size=8",
        ],
    )
    config, run, logs = work / "config.yaml", work / "run", work / "logs"
    logs.mkdir()
    config.write_text(config_to_yaml(cfg))
    path = os.pathsep.join([str(work.parent), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "HETERORL_TOKEN": TOKEN, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    env.pop(ENV, None)
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, *args: str, extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with (logs / f"{name}.log").open("wb") as log:
            argv = [sys.executable, "-m", "heterorl.live.node", *args]
            procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**env, **(extra or {})})
        return procs[name]

    address = run / "live" / "learner.json"
    try:
        first = start(
            "learner-1", "learner", str(config), "--run-dir", str(run), extra={ENV: failpoint} if failpoint else {}
        )
        for i, name in enumerate(("a", "b")):
            start(name, "sampler", str(config), "--connect-file", str(address), "--index", str(i))
        wait(address.is_file, 120, "the learner to listen")
        url = json.loads(address.read_text())["url"]
        if failpoint is None:
            wait(lambda: status(url).get("steps", 0) >= kill_after_steps, 120, f"{kill_after_steps} steps")
            first.send_signal(signal.SIGKILL)
        code = first.wait(timeout=120)
        killed_at = max((e["version"] for e in read_events(logs / "learner-1.log", "trained")), default=0)
        acked_before = acked(logs)
        listen = "127.0.0.1:" + url.rsplit(":", 1)[1]
        second = start("learner-2", "learner", str(config), "--listen", listen, "--run-dir", str(run), "--resume")
        assert second.wait(timeout=180) == 0, (logs / "learner-2.log").read_text()[-2000:]
        samplers_done = all(procs[name].wait(timeout=60) == 0 for name in ("a", "b"))
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return {**verify(run, logs, code, killed_at, acked_before), "samplers told finished": samplers_done}


def acked(logs: Path) -> set[str]:
    return {
        e["group_id"]
        for name in ("a", "b")
        for e in read_events(logs / f"{name}.log", "pushed")
        if e["outcome"] in ("accepted", "duplicate")
    }


def verify(run: Path, logs: Path, code: int, killed_at: int, acked_before: set[str]) -> dict:
    state = latest_state(run / "live" / "state")
    assert state is not None
    meta = json.loads((state / "state.json").read_text())
    limits = GroupLimits(vocab_size=2**31 - 1, current_version=2**31 - 1)
    queued = {decode_group(m, limits).group_id for m in read_records(state / "queue.records", meta["queue_count"])}
    consumed = set(meta["extra"]["consumed_ids"])
    lineage: dict[int, list[str]] = {}
    for name in ("learner-1", "learner-2"):
        resumed = [e["version"] for e in read_events(logs / f"{name}.log", "resumed")]
        if resumed:
            lineage = {v: g for v, g in lineage.items() if v <= resumed[0]}
        for e in read_events(logs / f"{name}.log", "trained"):
            lineage[e["version"]] = e["groups"]
    trained = Counter(g for groups in lineage.values() for g in groups)
    all_acked = acked(logs)
    steps = [r["step"] for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    (resume,) = read_events(logs / "learner-2.log", "resumed")
    duplicates = sum(
        e["outcome"] == "duplicate" for name in ("a", "b") for e in read_events(logs / f"{name}.log", "pushed")
    )
    return {
        "exit": code,
        "killed after step": killed_at,
        "resumed at": resume["version"],
        "acked before kill": len(acked_before),
        "acked": len(all_acked),
        "lost": len(all_acked - consumed - queued),
        "trained twice": sum(n > 1 for n in trained.values()),
        "records 1..S once": steps == list(range(1, STEPS + 1)),
        "duplicates answered": duplicates,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="run the scenarios whose name contains this")
    args = parser.parse_args(argv)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "heterorl_kill9_reward.py").write_text(REWARD)
        Policy.from_config(ModelConfig(**TINY), seed=0).save(root / "model")
        for i, (name, failpoint, steps) in enumerate(SCENARIOS):
            if args.only and args.only not in name:
                continue
            work = root / f"s{i}"
            work.mkdir()
            began = time.monotonic()
            row = scenario(work, root / "model", failpoint, steps)
            bad += row["lost"] + row["trained twice"] + (not row["records 1..S once"]) + (row["exit"] != -9)
            print(f"| {name} | " + " | ".join(str(v) for v in row.values()) + f" | {time.monotonic() - began:.0f} s |")
            sys.stdout.flush()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
