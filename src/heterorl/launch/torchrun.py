"""`--nproc N`: the same `heterorl` command again, as N processes under torchrun on this host (loopback only).

torchrun (`torch.distributed.run`, part of torch) sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT
for each process; `heterorl.parallel.distributed.start` reads them. For several hosts, run torchrun yourself
(docs/deployment.md).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


def torchrun_argv(nproc: int, args: list[str], port: int, log_dir: str | None = None) -> list[str]:
    """`python -m torch.distributed.run ... -m heterorl.cli ARGS`, one node, rendezvous on 127.0.0.1:`port`.

    With `log_dir`, what the follower ranks print goes to files there (`<log_dir>/<run id>/attempt_0/<rank>/`)
    instead of the console: rank 0 speaks for the run (progress, summary, errors), and a follower's only words
    are usually its reaction to rank 0 ending first."""
    quiet = [f"--log-dir={log_dir}", "--redirects=" + ",".join(f"{r}:3" for r in range(1, nproc))]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--nnodes=1",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        *(quiet if log_dir is not None and nproc > 1 else []),
        "-m",
        "heterorl.cli",
        *strip_nproc(args),
    ]


def failed_rank(failures: Mapping[int, Any]) -> tuple[int, Any]:
    """The rank whose failure ended the run: the lowest one that did not die of the SIGTERM the agent sends every
    rank still running once one has failed (rank 0, stopped that way, would hide the follower that failed); the
    lowest rank when all of them did (the run itself was terminated)."""
    own = {rank: f for rank, f in failures.items() if f.exitcode != -signal.SIGTERM}
    return min((own or failures).items())


def last_line(path: Path) -> str:
    """A follower's last non-empty line of output (its one-line error, the CLI's), or a word that it left none."""
    lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines() if path.is_file() else []
    return lines[-1].strip() if lines else "no output"


def torchrun_self(nproc: int) -> int:
    """Run this command as `nproc` processes under torchrun's agent, in this process; returns the exit code.

    A rank that fails prints its own one-line error (the CLI's); the agent's traceback and log lines would bury
    it, so they are kept quiet and a failure becomes one more line naming the rank and its exit code. Ctrl-C or
    SIGTERM reaches the ranks through the agent (rank 0 saves what it can and says how to continue); the agent
    then returns 130 without a traceback of its own."""
    if "RANK" in os.environ:
        raise LaunchError("--nproc given inside torchrun: drop it, torchrun already started the processes")
    import torch.distributed

    if not torch.distributed.is_available():
        raise LaunchError("this torch build has no torch.distributed, which --nproc (torchrun) needs")
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's peers meet on loopback, not the first interface
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # torchrun's own choice, without its banner saying so
    log_dir = tempfile.mkdtemp(prefix="heterorl-ranks-")
    argv = torchrun_argv(nproc, sys.argv[1:], free_port(), log_dir)
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    keep_logs = False  # kept only when a follower failed: the error line names a file there
    try:
        run(parse_args(argv[3:]))  # argv[3:]: torchrun's own arguments (after `python -m torch.distributed.run`)
    except ChildFailedError as exc:
        rank, failure = failed_rank(exc.failures)
        keep_logs = rank != 0
        if rank == 0:
            raise LaunchError(f"rank 0 of {nproc} exited with code {failure.exitcode} (its error is above)") from None
        output = Path(failure.error_file).parent / "stderr.log"
        raise LaunchError(
            f"rank {rank} of {nproc} exited with code {failure.exitcode}: {last_line(output)} (its output: {output})"
        ) from None
    except SignalException:
        return 130
    finally:
        if not keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
    return 0
