"""`heterorl learner`: one learner process serving the live cluster, writing a normal run directory.

The run directory is the simulated mode's (config.yaml, metrics.jsonl, summary.json, checkpoint/) plus `live/`:
`learner.json` (the URL it listens on, for launchers), `state/` (durable learner states), `journal/` (accepted
groups since the last state). `--resume` continues a killed or stopped learner from its newest state.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from heterorl.config import RunConfig
from heterorl.console import progress_bar
from heterorl.live.eventlog import EventLog
from heterorl.live.learner_loop_live import LiveLearner
from heterorl.live.preflight import LiveSetupError, check_live_config, parse_listen
from heterorl.loop.journal import segment_indices
from heterorl.loop.state import latest_state, restore_learner_state
from heterorl.run import RunRecorder, make_learner, new_run_dir, prepare_run_dir, resolve_base_model
from heterorl.tasks import make_task
from heterorl.transport.http.auth import configured_token, new_token
from heterorl.transport.http.service import serve_app


def _comparable(cfg: RunConfig) -> dict[str, Any]:
    return cfg.model_dump(mode="json", exclude={"live"})


def _check_run_dir(cfg: RunConfig, run_dir: Path, resume: bool) -> None:
    state_root, journal = run_dir / "live" / "state", run_dir / "live" / "journal"
    if not resume:
        if latest_state(state_root) is not None or segment_indices(journal):
            raise LiveSetupError(f"{run_dir} already holds a live learner; pass --resume or use a new run directory")
        return
    if latest_state(state_root) is None:
        raise LiveSetupError(f"--resume: no learner state under {state_root}")
    saved_cfg = RunConfig.model_validate(yaml.safe_load((run_dir / "config.yaml").read_text()))
    if _comparable(saved_cfg) != _comparable(cfg):
        raise LiveSetupError(f"--resume: the config differs from {run_dir / 'config.yaml'} (only `live` may change)")


def _truncate(path: Path, nbytes: int) -> None:
    """Cut metrics.jsonl back to the checkpoint: the records of steps that are redone after a resume go."""
    if path.is_file() and path.stat().st_size > nbytes:
        with path.open("r+b") as f:
            f.truncate(nbytes)


def resolve_learner_token(cfg: RunConfig) -> str:
    """The configured token, or a fresh one announced on stderr (samplers need it)."""
    token = configured_token(cfg.live)
    if token is None:
        token = new_token()
        print(
            f"heterorl learner: no token in ${cfg.live.token_env} or live.token_file; generated one:\n"
            f"  {token}\nStart samplers with {cfg.live.token_env} set to it.",
            file=sys.stderr,
            flush=True,
        )
    return token


def serve_learner(
    cfg: RunConfig,
    listen: str = "127.0.0.1:8470",
    run_dir: str | Path | None = None,
    resume: bool = False,
    show_progress: bool = True,
) -> dict[str, Any] | None:
    """Run the learner service until `learner.steps` (-> the summary, also in summary.json) or a stop signal
    (-> None; the state is saved and `resume=True` continues it)."""
    wall_start = time.monotonic()
    host, port = parse_listen(listen)
    check_live_config(cfg)
    if run_dir is None:
        if resume:
            raise LiveSetupError("--resume needs --run-dir")
        run_dir = new_run_dir(name="live")
    run_dir = Path(run_dir)
    _check_run_dir(cfg, run_dir, resume)
    token = resolve_learner_token(cfg)
    run_dir = prepare_run_dir(cfg, run_dir)
    (run_dir / "live").mkdir(exist_ok=True)
    address = run_dir / "live" / "learner.json"
    address.unlink(missing_ok=True)
    torch.manual_seed(cfg.seed)
    base, pretrain_info = resolve_base_model(cfg, show_progress)
    task = make_task(cfg.task)
    saved = None
    if resume:
        path = latest_state(run_dir / "live" / "state")
        assert path is not None, "checked by _check_run_dir"
        learner = make_learner(cfg, str(path / "model"))
        saved = restore_learner_state(learner, path)
        _truncate(run_dir / "metrics.jsonl", int(saved.extra["metrics_bytes"]))
    else:
        learner = make_learner(cfg, base)
    with progress_bar("RL", total=cfg.learner.steps, enabled=show_progress) as bar:
        if saved is not None:
            bar.advance(saved.version)
        recorder = RunRecorder(cfg, run_dir, learner, task, bar)
        extra = {"base_model": str(base), "pretrain": pretrain_info}
        live = LiveLearner(cfg, run_dir, learner, recorder, EventLog(), saved, extra)
        live.publish()
        asyncio.run(serve_app(live, token, host, port, address))
    if live.summary is None:
        return None
    summary = {**live.summary, "wall_seconds": live.elapsed_before + time.monotonic() - wall_start}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
