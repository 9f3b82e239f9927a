"""The lab's plumbing: network namespaces, TUN devices and the `ip` commands that wire them (Linux, root).

Each node (the learner, each sampler) gets a named network namespace `hrl-<pid>-<n>-<node>` holding one TUN
device, renamed `wan0`, with the node's address and a route to the lab's subnet through it. The TUN is opened
here, in the root namespace (TUNSETIFF), then moved into the node's namespace; its file descriptor stays valid,
so the router process that holds it reads every packet the node sends and writes every packet it receives. A
TUN device disappears with the last descriptor that holds it; a namespace lasts until `ip netns del`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import shutil
import signal
import struct
import subprocess
from pathlib import Path
from typing import IO, AnyStr

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
NETNS_DIR = Path("/var/run/netns")
PREFIX = "hrl"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-\d+-")


class LabError(RuntimeError):
    """The WAN lab cannot run here or was set up wrongly; the message is one line that says what to do."""


def check_host() -> None:
    """Refuse, with one line, a host where the lab cannot work."""
    if os.geteuid() != 0:
        raise LabError("the WAN lab needs root: it makes network namespaces and TUN devices (run it as root)")
    if shutil.which("ip") is None:
        raise LabError("the WAN lab needs the `ip` command (iproute2: apt-get install iproute2)")
    if not Path("/dev/net/tun").exists():
        raise LabError("the WAN lab needs /dev/net/tun (load the tun module: modprobe tun)")


def readline(pipe: IO[AnyStr], timeout: float, what: str) -> AnyStr:
    """One line from a child's pipe, or a LabError naming `what` when none comes within `timeout` seconds."""
    ready, _, _ = select.select([pipe], [], [], timeout)
    if not ready:
        raise LabError(f"{what} did not answer within {timeout:.0f} s")
    return pipe.readline()


def ip(*args: str, netns: str | None = None) -> str:
    """Run `ip [-n netns] args...`; a failure is a LabError with ip's own message."""
    cmd = ["ip", *(["-n", netns] if netns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no message"])[0]
        raise LabError(f"`{' '.join(cmd)}` failed: {reason}")
    return done.stdout


def open_tun(name: str) -> int:
    """Create a TUN device (raw IPv4 packets, no packet-info header) and return its descriptor (non-blocking)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError as exc:
        os.close(fd)
        raise LabError(f"cannot create the TUN device {name}: {exc.strerror}") from None
    return fd


def make_node(netns: str, tun: str, address: str, prefix_len: int, mtu: int, sysctls: dict[str, str]) -> None:
    """Move TUN `tun` into the new namespace `netns` as `wan0`, address it and bring it and loopback up."""
    ip("netns", "add", netns)
    ip("link", "set", "dev", tun, "netns", netns)
    ip("link", "set", "dev", tun, "name", "wan0", netns=netns)
    ip("link", "set", "dev", "wan0", "mtu", str(mtu), netns=netns)
    ip("addr", "add", f"{address}/{prefix_len}", "dev", "wan0", netns=netns)
    ip("link", "set", "dev", "lo", "up", netns=netns)
    ip("link", "set", "dev", "wan0", "up", netns=netns)
    for key, value in sysctls.items():
        set_sysctl(netns, key, value)


def set_sysctl(netns: str, key: str, value: str) -> None:
    """Write a per-namespace sysctl (net.*) from inside the namespace."""
    done = subprocess.run(
        ["ip", "netns", "exec", netns, "sysctl", "-q", "-w", f"{key}={value}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise LabError(f"cannot set {key}={value} in {netns}: {done.stderr.strip() or 'no message'}")


ALLOWED_CC = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
AVAILABLE_CC = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


def allow_congestion_control(name: str) -> str | None:
    """Let namespaces choose `name` as their default congestion control.

    Linux lets a namespace other than the first pick only algorithms in the host-wide
    tcp_allowed_congestion_control list (`cubic` is often missing when the host's default is another). Adds
    `name` to that list and returns the list as it was, for `restore_allowed`; None when nothing changed."""
    if name not in AVAILABLE_CC.read_text().split():
        raise LabError(
            f"congestion control {name!r} is not available on this kernel "
            f"(available: {AVAILABLE_CC.read_text().strip()})"
        )
    before = ALLOWED_CC.read_text().strip()
    if name in before.split():
        return None
    ALLOWED_CC.write_text(f"{before} {name}")
    return before


def restore_allowed(before: str, added: str) -> None:
    """Undo `allow_congestion_control`, unless someone changed the list since."""
    now = ALLOWED_CC.read_text().split()
    if now == [*before.split(), added]:
        ALLOWED_CC.write_text(before)


def pids_in(netns: str) -> list[int]:
    """Processes living in the namespace."""
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def delete_netns(netns: str) -> None:
    """Kill what still runs in the namespace (processes the lab started), then delete it."""
    for pid in pids_in(netns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)


def lab_namespaces() -> list[str]:
    """Names of the namespaces labs made (alive or left behind)."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if _NAME.match(p.name))


def remove_stale() -> list[str]:
    """Delete namespaces left by labs whose process is gone (killed before it could clean up)."""
    removed = []
    for name in lab_namespaces():
        match = _NAME.match(name)
        assert match is not None
        if not _alive(int(match.group(1))):
            delete_netns(name)
            removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
