"""`WanLab`: a learner and samplers as real processes in their own network namespaces, joined by shaped links.

    with WanLab([link0, link1], seed=0) as lab:          # one LinkConfig per sampler
        server = lab.popen("learner", ["python", "-m", "http.server", "8000", "--bind", lab.learner_ip])
        lab.exec(0, ["curl", f"http://{lab.learner_ip}:8000/"])   # from sampler 0, through link 0
        print(lab.stats())                                # the router's counters per link and direction

The learner is at `lab.learner_ip` (10.77.0.1 by default), sampler i at `lab.address(i)` (10.77.0.<i+2>).
Traffic between the learner and sampler i crosses link i, shaped by the router process (`heterorl.lab.router`):
`weights_*` settings act on learner -> sampler packets, `rollout_*` on sampler -> learner ones; samplers cannot
reach each other. Time zero of the links' schedules (outages, traces) is `lab.t0`, taken as the router starts.

Leaving the block, normally, on an error or on Ctrl-C, stops the processes the lab started (SIGTERM, then SIGKILL
after `stop_timeout_s`), ends the router (its TUN devices go with it) and deletes the namespaces. Namespaces left
by a lab that was killed outright are removed by the next lab, or `heterorl lab clean`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any, Literal

from heterorl.config import LinkConfig
from heterorl.lab.netns import (
    LabError,
    allow_congestion_control,
    check_host,
    delete_netns,
    make_node,
    open_tun,
    readline,
    remove_stale,
    restore_allowed,
)

Node = Literal["learner"] | int
"""A lab node: "learner", or a sampler's index (0-based, the order of the links)."""

_COUNTER = itertools.count()
REPLY_TIMEOUT_S = 60.0  # the router answers a command at once; a minute allows for a machine that is swapping


class WanLab:
    """Network namespaces for a learner and its samplers, joined by emulated WAN links (see the module doc).

    `congestion_control` is set in every namespace (None keeps the kernel's default; `cubic` is Linux's usual
    one and what the `tcp` transfer model assumes); `mtu` is the TUN devices' MTU (1500 as on most WANs).
    """

    def __init__(
        self,
        links: Sequence[LinkConfig],
        seed: int = 0,
        *,
        subnet: str = "10.77.0",
        mtu: int = 1500,
        congestion_control: str | None = "cubic",
        stop_timeout_s: float = 5.0,
    ) -> None:
        if not 1 <= len(links) <= 250:
            raise LabError(f"a lab has 1 to 250 sampler links, got {len(links)}")
        parts = subnet.split(".")
        if len(parts) != 3 or not all(p.isdigit() and int(p) < 256 for p in parts):
            raise LabError(f"subnet {subnet!r} must be the first three octets of an IPv4 /24, e.g. 10.77.0")
        if not 576 <= mtu <= 65535:
            raise LabError(f"mtu {mtu} must be in 576..65535")
        self.links = list(links)
        self.seed = seed
        self.subnet = subnet
        self.mtu = mtu
        self.congestion_control = congestion_control
        self.stop_timeout_s = stop_timeout_s
        self.serial = next(_COUNTER)
        self.tag = f"{os.getpid()}-{self.serial}"
        self.t0 = 0.0
        self.scheduling = ""  # the router's: fifo (real time), nice or normal
        self._namespaces: list[str] = []
        self._router: subprocess.Popen[bytes] | None = None
        self._procs: list[subprocess.Popen[Any]] = []

    # --- addresses
    @property
    def learner_ip(self) -> str:
        return f"{self.subnet}.1"

    def address(self, node: Node) -> str:
        """A node's IPv4 address inside the lab."""
        return self.learner_ip if node == "learner" else f"{self.subnet}.{self._index(node) + 2}"

    def namespace(self, node: Node) -> str:
        """The name of a node's network namespace (`ip netns exec NAME ...` enters it)."""
        return f"hrl-{self.tag}-learner" if node == "learner" else f"hrl-{self.tag}-s{self._index(node)}"

    def _index(self, node: Node) -> int:
        if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < len(self.links):
            raise LabError(f"node {node!r} is not 'learner' or a sampler index in 0..{len(self.links) - 1}")
        return node

    @property
    def nodes(self) -> list[Node]:
        return ["learner", *range(len(self.links))]

    # --- life cycle
    def __enter__(self) -> WanLab:
        check_host()
        remove_stale()
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make_nodes(self, fds: dict[str, int]) -> None:
        """A namespace with its TUN device per node (descriptors into `fds`). A congestion control the host does
        not allow namespaces is allowed only while they pick it, then the host's list is put back."""
        sysctls = {"net.ipv6.conf.all.disable_ipv6": "1"}
        cc = self.congestion_control
        allowed_before = None if cc is None else allow_congestion_control(cc)
        if cc is not None:
            sysctls["net.ipv4.tcp_congestion_control"] = cc
        try:
            for node in self.nodes:
                netns = self.namespace(node)
                # unique in the root namespace while it is made (renamed wan0 inside); at most 15 characters
                tun = f"h{os.getpid() % 0x100000:x}{self.serial % 256:x}n{len(fds)}"
                fds[str(node)] = open_tun(tun)
                self._namespaces.append(netns)
                make_node(netns, tun, self.address(node), 24, self.mtu, sysctls)
        finally:
            if allowed_before is not None and cc is not None:
                restore_allowed(allowed_before, cc)

    def _start(self) -> None:
        fds: dict[str, int] = {}
        try:
            self._make_nodes(fds)
            spec = {
                "seed": self.seed,
                "learner": {"fd": fds["learner"], "ip": self.learner_ip},
                "samplers": [
                    {"fd": fds[str(i)], "ip": self.address(i), "link": link.model_dump(mode="json")}
                    for i, link in enumerate(self.links)
                ],
            }
            self._router = subprocess.Popen(
                [sys.executable, "-m", "heterorl.lab.router"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                bufsize=0,  # unbuffered: `readline` waits on the pipe itself (select), nothing hides in a buffer
                pass_fds=tuple(fds.values()),
                start_new_session=True,
            )
            self.t0 = time.monotonic()
            spec["t0"] = self.t0
            self._command(json.dumps(spec))
        finally:
            for fd in fds.values():
                os.close(fd)  # the router holds its own copies; the devices live as long as it does
        reply = self._reply()
        if reply.get("ready") is not True:
            raise LabError(f"the lab's router did not start: {reply}")
        self.scheduling = reply["scheduling"]

    def _command(self, line: str) -> None:
        assert self._router is not None, "no router"
        assert self._router.stdin is not None, "the router's stdin is a pipe"
        self._router.stdin.write(line.encode() + b"\n")
        self._router.stdin.flush()

    def _reply(self) -> dict:
        assert self._router is not None, "no router"
        assert self._router.stdout is not None, "the router's stdout is a pipe"
        line = readline(self._router.stdout, REPLY_TIMEOUT_S, "the lab's router")
        if not line:
            raise LabError(f"the lab's router exited (status {self._router.wait()}); its error is above")
        return json.loads(line)

    def close(self) -> None:
        """Stop the lab's processes, the router, and delete the namespaces (idempotent)."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + self.stop_timeout_s
        for proc in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self._procs.clear()
        if self._router is not None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self._command("quit")
            try:
                self._router.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self._router.kill()
                self._router.wait()
            for pipe in (self._router.stdin, self._router.stdout):
                if pipe is not None:
                    pipe.close()
            self._router = None
        for netns in self._namespaces:
            delete_netns(netns)
        self._namespaces.clear()

    # --- processes
    def _enter(self, node: Node, argv: Sequence[str]) -> list[str]:
        if self._router is None:
            raise LabError("the lab is not running (use it inside `with WanLab(...) as lab:`)")
        return ["ip", "netns", "exec", self.namespace(node), *argv]

    def popen(self, node: Node, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` in a node's namespace (keyword arguments go to subprocess.Popen); the lab stops it on exit."""
        proc = subprocess.Popen(self._enter(node, argv), **kwargs)
        self._procs.append(proc)
        return proc

    def exec(self, node: Node, argv: Sequence[str], timeout: float | None = 60.0, **kwargs: Any):
        """Run `argv` in a node's namespace to the end (subprocess.run; output captured as text by default)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self._enter(node, argv), timeout=timeout, check=False, **kwargs)

    # --- measurements
    def stats(self) -> dict:
        """The router's counters: per link and direction packets, bytes, delivered, dropped by loss / queue / cut,
        reordered, the longest queue; its CPU seconds and how late it wrote a packet at worst."""
        if self._router is None:
            raise LabError("the lab is not running")
        self._command("stats")
        return self._reply()

    def cut(self, node: Node, seconds: float) -> None:
        """Cut a sampler's link in both directions from now for `seconds` (beside its scheduled `outages`):
        what a test or a user watching the run does to see how it rides out a cut at a chosen moment."""
        if self._router is None:
            raise LabError("the lab is not running")
        if not 0.0 < seconds <= 86_400.0:
            raise LabError(f"a cut lasts more than 0 and at most 86400 seconds, not {seconds}")
        self._command(f"cut {self._index(node)} {seconds!r}")

    def elapsed(self) -> float:
        """Seconds since the links' time zero (outages and traces count from it)."""
        return time.monotonic() - self.t0
