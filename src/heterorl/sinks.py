"""Optional sinks: a run's metrics, with the same keys as metrics.jsonl, in TensorBoard event files or a
Weights & Biases run.

Neither package is a dependency of heterorl; each sink imports its package when used and, if it is missing,
raises an error that names the package to install. Records are replayed in file order with their `step`, so
evaluation records land on the learner step they were taken at (metrics.jsonl steps never decrease, as W&B
requires).

W&B is offline (files under <run_dir>/wandb, `wandb sync` later) or online (`metrics.wandb_mode: online`).
Online needs an API key (`WANDB_API_KEY`, or a `~/.netrc` entry written by `wandb login`) and a reachable server
(`WANDB_BASE_URL`, default https://api.wandb.ai). `wandb_preflight` checks both without contacting W&B beyond one
TCP connection, so a run that cannot log online fails in a second, with one line, rather than at its end or after
the library's retries. `WandbRun` logs records as they come (a live dashboard) or replays a finished run
(`wandb_export`).
"""

from __future__ import annotations

import importlib.util
import math
import netrc
import os
import socket
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

from heterorl.errors import MissingDependencyError, SetupError
from heterorl.metrics import read_metrics

NON_SCALARS = frozenset({"kind", "step"})


class MissingPackageError(MissingDependencyError):
    """An optional export was asked for but its package is not installed."""


def require(module: str, package: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MissingPackageError(f"{what} needs the `{package}` package: pip install {package}")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's numeric, finite values (booleans and nulls are not scalars to plot)."""
    return {
        k: float(v)
        for k, v in record.items()
        if k not in NON_SCALARS and isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))
    }


def tensorboard_export(run_dir: Path, log_dir: Path | None = None) -> Path:
    """Write `run_dir`/metrics.jsonl as TensorBoard scalars (default log dir: `run_dir`/tensorboard)."""
    require("tensorboard", "tensorboard", "TensorBoard export")
    from torch.utils.tensorboard import SummaryWriter

    run_dir = Path(run_dir)
    log_dir = Path(log_dir) if log_dir is not None else run_dir / "tensorboard"
    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        for record in read_metrics(run_dir / "metrics.jsonl"):
            for key, value in scalars(record).items():
                writer.add_scalar(key, value, global_step=int(record["step"]))
    finally:
        writer.close()
    return log_dir


# --- Weights & Biases
WandbMode = Literal["offline", "online"]
DEFAULT_HOST = "https://api.wandb.ai"
CONNECT_TIMEOUT_S = 5.0


class SinkError(SetupError):
    """A metric sink cannot work as configured (no W&B API key, no network for online mode)."""


def wandb_host() -> str:
    return os.environ.get("WANDB_BASE_URL", DEFAULT_HOST).rstrip("/")


def _has_api_key(host: str) -> bool:
    """WANDB_API_KEY, or a netrc entry for the host (what `wandb login` writes)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    path = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    if not path.is_file():
        return False
    try:
        entry = netrc.netrc(str(path)).authenticators(urlsplit(host).hostname or "")
    except (netrc.NetrcParseError, OSError):
        return False
    return entry is not None and bool(entry[2])


def wandb_preflight(mode: WandbMode) -> None:
    """For online mode: SinkError unless an API key is configured and the W&B server accepts a connection."""
    require("wandb", "wandb", "W&B logging")
    if mode != "online":
        return
    host = wandb_host()
    if not _has_api_key(host):
        raise SinkError(
            f"metrics.wandb_mode online needs a W&B API key for {host}: set WANDB_API_KEY or run `wandb login` "
            "(or use wandb_mode offline and `wandb sync` later)"
        )
    url = urlsplit(host)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "", port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise SinkError(
            f"metrics.wandb_mode online, but {host} cannot be reached ({exc}); "
            "use wandb_mode offline and `wandb sync <run_dir>/wandb` once online"
        ) from None


class WandbRun:
    """One W&B run for one heterorl run directory: `log(record)` for each metrics record, then `finish()`.
    The run's resolved config.yaml becomes the W&B config; the W&B files live under <run_dir>/wandb."""

    def __init__(self, run_dir: Path, project: str, mode: WandbMode = "offline") -> None:
        wandb_preflight(mode)
        import wandb

        run_dir = Path(run_dir)
        config_path = run_dir / "config.yaml"
        config: dict[str, Any] = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}
        try:
            self.run = wandb.init(project=project, name=run_dir.name, dir=str(run_dir), mode=mode, config=config)
        except wandb.errors.Error as exc:  # a rejected key, a project it may not write to: the server's word
            raise SinkError(f"W&B ({mode}): {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from exc

    def log(self, record: dict[str, Any]) -> None:
        self.run.log(scalars(record), step=int(record["step"]))

    def finish(self) -> Path:
        """Close the run; returns its directory (<run_dir>/wandb/<offline-|>run-...)."""
        self.run.finish()
        return Path(self.run.dir).parent


def wandb_export(run_dir: Path, project: str = "heterorl", mode: WandbMode = "offline") -> Path:
    """Replay `run_dir`/metrics.jsonl into a W&B run (offline by default: `wandb sync` later). Returns the W&B
    run's directory."""
    sink = WandbRun(run_dir, project, mode)
    try:
        for record in read_metrics(Path(run_dir) / "metrics.jsonl"):
            sink.log(record)
    finally:
        path = sink.finish()
    return path
