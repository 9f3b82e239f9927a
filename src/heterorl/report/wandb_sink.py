"""Weights & Biases: a run's metrics, with the same keys as metrics.jsonl, offline (files under <run_dir>/wandb,
`wandb sync` later) or online (to the W&B server; `metrics.wandb_mode: online`).

Online needs an API key (`WANDB_API_KEY`, or a `~/.netrc` entry written by `wandb login`) and a reachable
server (`WANDB_BASE_URL`, default https://api.wandb.ai). `wandb_preflight` checks both without contacting W&B
beyond one TCP connection, so a run that cannot log online fails in a second, with one line, rather than at its
end or after the library's retries. Neither check runs for offline mode.

`WandbRun` logs records as they come (a live dashboard) or replays a finished run's metrics.jsonl
(`wandb_export`). Records are logged with their `step`; metrics.jsonl steps never decrease, as W&B requires.
"""

from __future__ import annotations

import netrc
import os
import socket
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml

from heterorl.errors import SetupError
from heterorl.metrics import read_metrics
from heterorl.report.export import require, scalars

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
