"""`heterorl run --live`: the live cluster on one host -- a learner process and one process per sampler node,
joined over loopback HTTP on a free port (or in a WAN lab, `live.wan_lab`), writing the same run directory and
summary as the simulated mode.

The warm start is built (or found in the cache) here first, so the children only load it. Children log to
`<run>/live/learner.log` and `<run>/live/sampler-<i>.log` (JSON event lines); progress is read from the
learner's metrics.jsonl as it grows. Every child is ended on exit, error, Ctrl-C or SIGTERM: SIGTERM (the learner
then saves its state), then SIGKILL after a grace period; an interrupted run ends with one line saying what was
kept and how to continue (`--resume`). A child also dies with this process if it is killed outright
(`heterorl.process.die_with_parent`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from heterorl.config import RunConfig
from heterorl.console import Bar, progress_bar
from heterorl.durable.state import latest_state
from heterorl.lab import Node, WanLab
from heterorl.lab.netns import check_host
from heterorl.live.learner_node import check_same_config
from heterorl.live.node import PARENT_ENV
from heterorl.live.preflight import check_live_config
from heterorl.run.build import check_traces, checked_model_path, resolve_base_model
from heterorl.run.recorder import Observer
from heterorl.run.run_dir import prepare_run_dir
from heterorl.transport.http.auth import configured_token, new_token

POLL_S = 0.2
GRACE_S = 30.0  # time a terminated learner gets to write its final state
SAMPLER_EXIT_S = 15.0  # time samplers get to exit on their own after the learner's (they settle, then summarise)
LOG_TAIL_CHARS = 3000


class LiveRunError(RuntimeError):
    """A child process of the live run failed; the message carries the end of its log."""


def log_tail(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL_CHARS:] if path.is_file() else ""


class ProcessGroup:
    """Child processes, each in its own session and logging to a file, that are always ended on `close`; in a WAN
    lab's namespaces when given one (`node`: "learner" or a sampler's index)."""

    def __init__(self, env: dict[str, str], lab: WanLab | None = None) -> None:
        self.env, self.lab = env, lab
        self.procs: dict[str, tuple[subprocess.Popen[bytes], Path, IO[bytes]]] = {}

    def start(self, name: str, args: list[str], log: Path, node: Node = "learner") -> subprocess.Popen[bytes]:
        out = log.open("ab")
        argv = [sys.executable, "-m", "heterorl.live.node", *args]
        kwargs: dict[str, Any] = {
            "stdout": out,
            "stderr": subprocess.STDOUT,
            "env": self.env,
            "start_new_session": True,
        }
        proc = self.lab.popen(node, argv, **kwargs) if self.lab is not None else subprocess.Popen(argv, **kwargs)
        self.procs[name] = (proc, log, out)
        return proc

    def check(self, name: str) -> None:
        """Raise if child `name` has exited with an error."""
        proc, log, _ = self.procs[name]
        if proc.poll() not in (None, 0):
            raise LiveRunError(f"{name} exited with code {proc.returncode}; end of {log}:\n{log_tail(log)}")

    def wait_for(self, names: list[str], timeout_s: float) -> None:
        """Give children `names` up to `timeout_s` to exit on their own (a sampler told the run is over still
        settles the answers on their way and writes its summary line)."""
        deadline = time.monotonic() + timeout_s
        for name in names:
            try:
                self.procs[name][0].wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return

    def close(self) -> None:
        running = [p for p, _, _ in self.procs.values() if p.poll() is None]
        for proc in running:
            proc.terminate()
        deadline = time.monotonic() + GRACE_S
        for proc in running:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for _, _, out in self.procs.values():
            out.close()


class MetricsFollower:
    """Advances a progress bar from the records appended to metrics.jsonl (complete lines only), and hands each
    record to the observer (`heterorl.api.Trainer`) if there is one."""

    def __init__(self, path: Path, bar: Bar, observer: Observer | None = None) -> None:
        self.path, self.bar, self.offset, self.observer = path, bar, 0, observer
        self.steps = 0

    def poll(self) -> None:
        if not self.path.is_file():
            return
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            record = json.loads(line)
            if self.observer is not None:
                self.observer.observe(record)
            if record.get("kind") == "train":
                self.steps = record["step"]
                self.bar.advance(1, reward=record["reward/mean"], stale=record["stale/mean"])
            elif record.get("kind") == "eval" and record.get("step", 0) > 0:
                self.bar.advance(0, acc=record["eval/accuracy"])


def _wait_for_url(address: Path, procs: ProcessGroup, timeout_s: float) -> str:
    """The learner's URL once it listens (it writes `address` then); raises if it dies or takes too long."""
    learner = procs.procs["learner"][0]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        procs.check("learner")
        if learner.poll() == 0:
            raise LiveRunError("the learner exited before it started listening")
        if address.is_file():
            info = json.loads(address.read_text())
            if info.get("pid") == learner.pid:
                return str(info["url"])
        time.sleep(POLL_S)
    raise LiveRunError(f"the learner did not listen within {timeout_s:.0f} s")


class LiveInterruptedError(RuntimeError):
    """Ctrl-C or SIGTERM ended `run --live` early, after every child ended; `kept` says what the run directory
    holds (the learner's newest saved state), and the message how to continue (`--resume`)."""

    def __init__(self, run_dir: Path, version: int | None) -> None:
        if version is None:
            kept = f"{run_dir} holds no saved learner state yet"
            how = f"run it again with: heterorl run CONFIG --live --run-dir {run_dir} --overwrite"
        else:
            kept = f"{run_dir} keeps the learner's state saved at version {version}"
            how = f"continue with: heterorl run CONFIG --live --run-dir {run_dir} --resume"
        super().__init__(f"{kept}; {how}")
        self.run_dir, self.version, self.kept = run_dir, version, kept


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt here (as Ctrl-C does), so cleanup runs instead of the process vanishing
    and leaving its children behind. Main thread only (where signal handlers live)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def child_env(cfg: RunConfig, token: str) -> dict[str, str]:
    """The children's environment: the token, this process's pid (a child whose parent is gone exits), and torch
    threads split among the processes of this host."""
    env = {**os.environ, cfg.live.token_env: token, PARENT_ENV: str(os.getpid())}
    threads = max(1, (os.cpu_count() or 1) // (len(cfg.cluster.samplers) + 1))
    env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


def _run_children(
    cfg: RunConfig,
    run_dir: Path,
    procs: ProcessGroup,
    lab: WanLab | None,
    show_progress: bool,
    observer: Observer | None,
    resume: bool,
) -> None:
    """Start the learner and the samplers (in the lab's namespaces when there is one), follow the learner's
    metrics until it exits, end every child."""
    live_dir = run_dir / "live"
    config = str(run_dir / "config.yaml")
    address = live_dir / "learner.json"
    address.unlink(missing_ok=True)
    listen = f"{lab.learner_ip}:{cfg.live.wan_lab_port}" if lab is not None else "127.0.0.1:0"
    learner_args = ["learner", config, "--run-dir", str(run_dir), "--listen", listen, *(["--resume"] if resume else [])]
    try:
        procs.start("learner", learner_args, live_dir / "learner.log")
        names = [f"sampler-{i}" for i in range(len(cfg.cluster.samplers))]
        for i, name in enumerate(names):  # they start alongside the learner and wait for its address
            args = ["sampler", config, "--connect-file", str(address), "--index", str(i)]
            procs.start(name, args, live_dir / f"{name}.log", node=i)
        _wait_for_url(address, procs, cfg.live.startup_timeout_s)
        learner = procs.procs["learner"][0]
        with progress_bar("RL", total=cfg.learner.steps, enabled=show_progress, log_path=run_dir / "run.log") as bar:
            follower = MetricsFollower(run_dir / "metrics.jsonl", bar, observer)
            if observer is not None:
                observer.started()
            told = False
            while learner.poll() is None:
                follower.poll()
                if observer is not None and observer.stop_requested and not told:
                    learner.send_signal(signal.SIGUSR1)
                    told = True
                for name in names:
                    procs.check(name)
                time.sleep(POLL_S)
            follower.poll()
        procs.check("learner")
        procs.wait_for(names, SAMPLER_EXIT_S)
    finally:
        procs.close()


def run_live(
    cfg: RunConfig,
    run_dir: str | Path,
    show_progress: bool = True,
    overwrite: bool = False,
    observer: Observer | None = None,
    resume: bool = False,
    lab_services: Callable[[WanLab], contextlib.AbstractContextManager[object]] | None = None,
) -> dict[str, Any]:
    """Run `cfg` on a live local cluster (one learner + one process per sampler node) into `run_dir` (refused if
    it holds a run, unless `overwrite`; `resume` continues an interrupted one from the learner's saved state).
    `observer` sees every record as the learner writes it; when it asks to stop, the learner is told to finish
    (SIGUSR1: last evaluation, checkpoint, summary). Ctrl-C or SIGTERM: LiveInterruptedError, after every child
    has ended (the learner saved its state). `lab_services` (with `live.wan_lab`): entered once the lab is up and
    before the children start, left after they end -- e.g. an S3 server in the learner's namespace."""
    wall_start = time.monotonic()
    check_live_config(cfg)
    if cfg.live.wan_lab:
        check_host()  # root, iproute2, /dev/net/tun: refused before the warm start is built
    check_traces(cfg)
    checked_model_path(cfg)
    if cfg.trust.credentials is not None:
        raise LiveRunError(
            "run --live starts every sampler with one token; with trust.credentials each sampler has its own: "
            "start `heterorl learner` and each `heterorl sampler` with its token (`heterorl keys sampler`)"
        )
    run_dir = Path(run_dir)
    if resume and not (run_dir / "live" / "state").is_dir():
        raise LiveRunError(f"--resume: {run_dir} holds no live learner state to continue (nothing to resume)")
    if resume:  # before the run directory's config.yaml, which the learner reads, is written again
        check_same_config(cfg, run_dir)
    run_dir = prepare_run_dir(cfg, run_dir, overwrite=overwrite, resume=resume)
    live_dir = run_dir / "live"
    live_dir.mkdir(exist_ok=True)
    resolve_base_model(cfg, show_progress)
    links = [node.link for node in cfg.cluster.samplers]
    try:
        with (
            sigterm_as_interrupt(),
            WanLab(links, seed=cfg.seed) if cfg.live.wan_lab else contextlib.nullcontext() as lab,
            lab_services(lab) if lab is not None and lab_services is not None else contextlib.nullcontext(),
        ):
            procs = ProcessGroup(child_env(cfg, configured_token(cfg.live) or new_token()), lab)
            _run_children(cfg, run_dir, procs, lab, show_progress, observer, resume)
    except KeyboardInterrupt:
        state = latest_state(live_dir / "state")
        version = int(state.name.rsplit("-v", 1)[1]) if state else None
        raise LiveInterruptedError(run_dir, version) from None
    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        raise LiveRunError(
            f"the learner stopped before the last step; end of its log:\n{log_tail(live_dir / 'learner.log')}"
        )
    summary = json.loads(summary_path.read_text())
    summary["wall_seconds"] = time.monotonic() - wall_start
    summary_path.write_text(json.dumps(summary, indent=2))
    return summary
