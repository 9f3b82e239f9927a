"""`--nproc N`: the same `heterorl` command again, as N processes under torchrun on this host (loopback only).

torchrun (`torch.distributed.run`, part of torch) sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT
for each process; `heterorl.parallel.distributed.start` reads them. For several hosts, run torchrun yourself
(docs/deployment.md).
"""

from __future__ import annotations

import os
import socket
import sys

from heterorl.launch.errors import LaunchError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the rendezvous binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def strip_nproc(args: list[str]) -> list[str]:
    """The command's arguments without `--nproc N` / `--nproc=N` (torchrun's processes must not start it again)."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def torchrun_argv(nproc: int, args: list[str], port: int) -> list[str]:
    """`python -m torch.distributed.run ... -m heterorl.cli ARGS`, one node, rendezvous on 127.0.0.1:`port`."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--nnodes=1",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        "-m",
        "heterorl.cli",
        *strip_nproc(args),
    ]


def torchrun_self(nproc: int) -> int:
    """Replace this process with torchrun running this command as `nproc` processes (returns only on failure)."""
    if "RANK" in os.environ:
        raise LaunchError("--nproc given inside torchrun: drop it, torchrun already started the processes")
    import torch.distributed

    if not torch.distributed.is_available():
        raise LaunchError("this torch build has no torch.distributed, which --nproc (torchrun) needs")
    env = dict(os.environ)
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's peers meet on loopback, not the host's first interface
    argv = torchrun_argv(nproc, sys.argv[1:], free_port())
    os.execve(sys.executable, argv, env)
    return 1  # pragma: no cover (execve does not return)
