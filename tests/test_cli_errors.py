"""Every user mistake the red team tried ends in at most three lines on stderr, all starting with the one prefix
every command uses, and a non-zero exit, never a traceback: bad config files and values (not UTF-8, recursive or
exploding YAML aliases, numbers past their bounds, non-finite floats, dates), usage mistakes, a port in use,
--connect to something that is not a learner (real TCP servers), a learner aimed at a simulated run's directory,
`sync inspect` of a missing path, and a refusal inside a learner started as torchrun ranks (real processes)."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heterorl.cli import app
from heterorl.cli_errors import ERROR_PREFIX
from heterorl.lab import netns

ALIAS_BOMB = b"a: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n".encode() for i in range(8)
)  # 9^9 = 387 million strings from a 350-byte file


@dataclass
class Mistake:
    """A command line (after the config path, which is written from `config`) and the words its line must hold."""

    config: bytes
    args: list[str]
    expected: str
    setup: Callable[[Path], list[str]] | None = None  # extra arguments that need a fixture (a port, a directory)
    no_config: bool = False
    env: dict[str, str] = field(default_factory=dict)
    not_root: bool = False  # run as a user other than root (the WAN lab refuses)


@pytest.fixture(scope="module")
def listening_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _web_server(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


class _AnswersEverything(_Quiet):
    """A web server that answers 200 and a page to every path (a wrong host behind a catch-all route)."""

    def do_GET(self) -> None:
        body = b"<html>hello</html>"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def file_server() -> Iterator[str]:
    """Python's own static file server: 404 for /v1/status."""
    yield from _web_server(_Quiet)


@pytest.fixture(scope="module")
def catch_all_server() -> Iterator[str]:
    yield from _web_server(_AnswersEverything)


def simulated_run_dir(tmp_path: Path) -> Path:
    """What `heterorl run` leaves: a config and metrics, no live/ state."""
    run = tmp_path / "simulated-run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "metrics.jsonl").write_text('{"kind": "eval", "step": 0, "eval/accuracy": 0.5}\n')
    return run


def live_run_dir(tmp_path: Path) -> Path:
    """What an interrupted `run --live` leaves: a config, metrics and a saved learner state."""
    run = tmp_path / "live-run"
    (run / "live" / "state" / "s1-v0").mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "metrics.jsonl").write_text('{"kind": "eval", "step": 0, "eval/accuracy": 0.5}\n')
    return run


MISTAKES = {
    "config not UTF-8": Mistake(b'seed: 1\ntask:\n  name: "\xff\xfe"\n', ["run"], "not UTF-8 text"),
    "a recursive alias": Mistake(b"a: &x [*x]\n", ["run"], "YAML alias"),
    "a recursive anchor in a section": Mistake(b"task: &t\n  name: addition\n  more: *t\n", ["run"], "YAML alias"),
    "a YAML alias bomb": Mistake(ALIAS_BOMB, ["run"], "expands past"),
    "an alias in an override": Mistake(b"seed: 0\n", ["run", "--set", "seed=&a [*a]"], "YAML alias"),
    "a date for a number": Mistake(b"seed: 2024-01-01\n", ["run"], "quote dates"),
    "seed=2**200": Mistake(b"seed: 0\n", ["run", "--set", f"seed={2**200}"], "seed"),
    "learner.steps=10^30": Mistake(b"seed: 0\n", ["run", "--set", f"learner.steps={10**30}"], "learner.steps"),
    "a non-finite lr": Mistake(b"learner:\n  lr: .nan\n", ["run"], "learner.lr"),
    "a delay of a million years": Mistake(
        b"cluster:\n  samplers:\n    - link: {weights_delay: {kind: fixed, seconds: 3.2e13}}\n",
        ["run"],
        "seconds",
    ),
    "model.path that is not there": Mistake(b"model:\n  path: /nonexistent/model\n", ["run"], "model.path"),
    "model.path on a learner": Mistake(b"model:\n  path: /nonexistent/model\n", ["learner"], "model.path"),
    "an unknown option": Mistake(b"seed: 0\n", ["run", "--bogus"], "No such option: --bogus"),
    "a word for a number": Mistake(b"seed: 0\n", ["sampler", "--index", "two"], "--index"),
    "--live with --ray": Mistake(b"seed: 0\n", ["run", "--live", "--ray", "local"], "pick one"),
    "--connect that is not a URL": Mistake(b"seed: 0\n", ["sampler", "--connect", "not-a-url"], "--connect"),
    "a port already in use": Mistake(
        b"seed: 0\n", ["learner"], "the port is in use", setup=lambda p: ["--listen", f"127.0.0.1:{p.port}"]
    ),
    "--connect to another web server": Mistake(
        b"seed: 0\n", ["sampler"], "answered 404", setup=lambda p: ["--connect", p.file_server]
    ),
    "--connect to a wrong path": Mistake(
        b"seed: 0\n",
        ["sampler"],
        "/wrong is not a heterorl learner",
        setup=lambda p: ["--connect", p.file_server + "/wrong"],
    ),
    "--connect to a server answering everything": Mistake(
        b"seed: 0\n", ["sampler"], "not a heterorl learner", setup=lambda p: ["--connect", p.catch_all]
    ),
    "learner --run-dir on a simulated run": Mistake(
        b"seed: 0\n", ["learner"], "not a live learner's", setup=lambda p: ["--run-dir", str(p.simulated)]
    ),
    "--resume without --live": Mistake(b"seed: 0\n", ["run", "--resume"], "--resume continues a live run"),
    "run --live --resume on a mistyped directory": Mistake(
        b"seed: 0\n", ["run", "--live", "--resume", "-q"], "nothing to resume"
    ),
    "--resume with --overwrite": Mistake(
        b"seed: 0\n",
        ["run", "--live", "--resume", "--overwrite", "-q"],
        "exclude each other",
        setup=lambda p: ["--run-dir", str(p.live)],
    ),
    "run --live --resume with another config": Mistake(
        b"seed: 1\nlearner: {lr: 0.0003}\n",
        ["run", "--live", "--resume", "-q"],
        "live-run/config.yaml in learner.lr (0.0001 -> 0.0003), seed (0 -> 1) (only `live` may change)",
        setup=lambda p: ["--run-dir", str(p.live)],
    ),
    "learner --resume with another config": Mistake(
        b"seed: 1\n",
        ["learner", "--resume", "--listen", "127.0.0.1:0"],
        "in seed (0 -> 1)",
        setup=lambda p: ["--run-dir", str(p.live)],
    ),
    "a missing trace file": Mistake(
        b"cluster:\n  samplers: [{link: {trace: no-such-trace.jsonl}}]\n", ["run"], "cannot read the trace"
    ),
    "a trace that is not a trace": Mistake(
        b"cluster:\n  samplers: [{link: {trace: config.yaml}}]\n", ["run"], "a trace must be a .jsonl or .csv"
    ),
    "a sampler name that cannot be a file name": Mistake(
        b"cluster:\n  samplers: [{name: a/b}]\n", ["run"], "cluster.samplers.0.name"
    ),
    "a lease of a year": Mistake(b"seed: 0\n", ["run", "--set", "cluster.lease_seconds=3.2e7"], "lease_seconds"),
    "live.dead_after_s of a day": Mistake(b"seed: 0\n", ["run", "--set", "live.dead_after_s=86400"], "dead_after_s"),
    "a sampler starting next year": Mistake(
        b"cluster:\n  samplers: [{start_delay_s: 3.2e7}]\n", ["run"], "start_delay_s"
    ),
    "a thousand codec threads": Mistake(b"seed: 0\n", ["run", "--set", "weights.codec_threads=1000"], "codec_threads"),
    "an outage in the far future": Mistake(
        b"cluster:\n  samplers: [{link: {outages: [{start: 1, end: 1e12}]}}]\n", ["run"], "outages.0.end"
    ),
    "wan_lab_port past 65535": Mistake(b"seed: 0\n", ["run", "--set", "live.wan_lab_port=70000"], "wan_lab_port"),
    "wan_lab and emulate_links": Mistake(
        b"live: {wan_lab: true, emulate_links: true}\n", ["run", "--live"], "choose one"
    ),
    "wan_lab under Ray": Mistake(b"live: {wan_lab: true}\n", ["run", "--ray", "local"], "Ray places its actors"),
    "wan_lab without root": Mistake(b"live: {wan_lab: true}\n", ["run", "--live", "-q"], "needs root", not_root=True),
    "lab ping without root": Mistake(b"seed: 0\n", ["lab", "ping"], "needs root", not_root=True),
    "lab clean without root": Mistake(b"", ["lab", "clean"], "needs root", no_config=True, not_root=True),
    "lab ping for hours": Mistake(b"seed: 0\n", ["lab", "ping", "--seconds", "1e9"], "--seconds"),
    "sync inspect of a missing path": Mistake(
        b"", ["sync", "inspect", "no/such/run"], "does not exist", no_config=True
    ),
    "eval of a directory without a checkpoint": Mistake(b"", ["eval", "."], "not a transformers", no_config=True),
}


@dataclass
class Fixtures:
    port: int
    file_server: str
    catch_all: str
    simulated: Path
    live: Path


def assert_one_mistake_line(output: str, expected: str) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 3, output
    assert lines[0].startswith(ERROR_PREFIX), output
    assert expected in output, output
    assert "Traceback" not in output, output
    assert "╭" not in output, output  # nor rich's boxed traceback or usage panel


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_mistake_is_one_clear_line(
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    listening_port: int,
    file_server: str,
    catch_all_server: str,
) -> None:
    mistake = MISTAKES[name]
    config = tmp_path / "config.yaml"
    config.write_bytes(mistake.config)
    monkeypatch.setenv("HETERORL_TOKEN", "t" * 24)
    monkeypatch.chdir(tmp_path)
    words = 2 if mistake.args[0] in ("lab", "sync") else 1  # a command group: its command comes next
    command, rest = mistake.args[0], mistake.args[words:]
    args = mistake.args[:words] + ([] if mistake.no_config else [str(config)])
    if command in ("run", "learner") and not mistake.no_config:
        args += ["--run-dir", str(tmp_path / "run")]
    if command == "learner" and mistake.setup is None:
        args += ["--listen", "127.0.0.1:0"]
    args += rest
    if mistake.setup is not None:
        fixtures = Fixtures(
            listening_port, file_server, catch_all_server, simulated_run_dir(tmp_path), live_run_dir(tmp_path)
        )
        args += mistake.setup(fixtures)
    if mistake.not_root:
        monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (1, 2), result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    assert_one_mistake_line(result.output, mistake.expected)


def test_the_alias_bomb_is_refused_before_it_is_built(tmp_path: Path) -> None:
    """The real command, as a process: refused at once, well under the memory the expansion would take."""
    config = tmp_path / "bomb.yaml"
    config.write_bytes(ALIAS_BOMB)
    assert len(ALIAS_BOMB) < 400
    result = subprocess.run(
        [sys.executable, "-m", "heterorl.cli", "run", str(config), "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert_one_mistake_line(result.stderr, "a YAML alias used too often")
    assert not (tmp_path / "run").exists()


@pytest.mark.processes
def test_a_refusal_under_torchrun_is_two_lines(tmp_path: Path) -> None:
    """`heterorl learner --nproc 2 --resume` on a directory it cannot continue: rank 0's own line, then the
    launcher's line naming the rank (torchrun's traceback and the follower's reaction stay out of sight)."""
    run = simulated_run_dir(tmp_path)
    env = {**os.environ, "HETERORL_TOKEN": "t" * 24, "TMPDIR": str(tmp_path)}
    args = ["learner", "--nproc", "2", "--resume", "--run-dir", str(run), "--listen", "127.0.0.1:0", "-q"]
    result = subprocess.run(
        [sys.executable, "-m", "heterorl.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr
    assert_one_mistake_line(result.stderr, "not a live learner's")
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == f"{ERROR_PREFIX}rank 0 of 2 exited with code 2 (its error is above)", result.stderr
    assert not list(tmp_path.glob("heterorl-ranks-*"))  # the followers' logs go when rank 0 reported the error


@pytest.mark.parametrize("group", [[], ["sync"], ["lab"]])
def test_a_command_group_alone_prints_its_help_once(group: list[str]) -> None:
    result = CliRunner().invoke(app, group)
    assert result.exit_code == 0, result.output
    assert result.output.count("Usage:") == 1, result.output


def test_a_sampler_aimed_where_nothing_listens_says_so_at_once_then_gives_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A closed port (real TCP): a line in words at the first failure, not only JSON retry lines, and one error
    line once `live.patience_s` has passed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    config = tmp_path / "config.yaml"
    config.write_text("seed: 0\n")
    monkeypatch.setenv("HETERORL_TOKEN", "t" * 24)
    url = f"http://127.0.0.1:{port}"
    result = CliRunner().invoke(app, ["sampler", str(config), "--connect", url, "--set", "live.patience_s=2"])
    assert result.exit_code == 1, result.output
    words = [line for line in result.output.splitlines() if not line.startswith("{")]
    assert len(words) == 2, result.output
    assert words[0].startswith(f"heterorl: no answer from {url} yet"), result.output
    assert words[0].endswith("retrying for up to 2 s (live.patience_s)"), result.output
    assert words[1].startswith(f"{ERROR_PREFIX}no answer from {url} for 2 s"), result.output
