"""The learner as several processes (torchrun, or Ray actors that set torchrun's variables): who does what.

Rank 0 is the learner every driver already knows: it alone has the intake (HTTP service or simulated cluster),
the publisher, the recorder and the durable state. The other ranks only follow (`follow`): they build the same
architecture, receive rank 0's weights and optimizer state (`Op.ATTACH`), then for every command train on their
share of the step's groups (`Op.TRAIN`), help gather a sharded optimizer state (`Op.OPTIMIZER`) or end
(`Op.STOP`). Commands and groups cross as tensors in heterorl's own formats, never pickled.

    ranks = start(cfg)                        torchrun's RANK / WORLD_SIZE / LOCAL_RANK -> a process group, or None
    run_as_rank(cfg, driver)                  rank 0 runs the driver (which calls attach(learner)), the others follow

A driver only adds `attach(learner)` once its learner is built (and restored, on resume): a no-op in one process.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn, TypeVar

import torch

from heterorl.config import RunConfig
from heterorl.learner import Learner
from heterorl.parallel.collectives import Channel, Op, decode_groups, from_json_bytes, to_json_bytes
from heterorl.policy import Policy, resolve_device
from heterorl.process import die_with_parent
from heterorl.run.build import configure_torch

T = TypeVar("T")
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class DistributedSetupError(RuntimeError):
    """A multi-process learner cannot start as configured; the message says what to change."""


@dataclass
class Ranks:
    """This process's place in the learner's process group."""

    cfg: RunConfig
    rank: int
    world: int
    device: torch.device
    channel: Channel

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def settle(self) -> None:
        """Every rank here before any tears the group down (a rank that destroyed its gloo group while another's
        last collective was still in flight aborted at exit, "terminate called without an active exception").
        Only on the way out of a run that ended well: after an error the other ranks may never come."""
        if torch.distributed.is_initialized():
            torch.distributed.barrier()

    def close(self) -> None:
        global _CURRENT
        _CURRENT = None
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


_CURRENT: Ranks | None = None


def _backend(cfg: RunConfig, device: torch.device) -> str:
    backend = cfg.parallel.backend
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise DistributedSetupError(
            f"parallel.backend nccl needs CUDA but model.device resolves to {device.type}: use backend gloo or auto"
        )
    if backend == "nccl" and not torch.distributed.is_nccl_available():
        raise DistributedSetupError("parallel.backend nccl: this torch build has no NCCL; use gloo or a CUDA build")
    return backend


def start(cfg: RunConfig) -> Ranks | None:
    """Join the process group torchrun (or the Ray launcher) described in the environment; None for one process."""
    global _CURRENT
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        return None
    missing = [v for v in TORCHRUN_VARS if v not in os.environ]
    if missing:
        raise DistributedSetupError(f"started as one rank of a group but {', '.join(missing)} unset: use torchrun")
    rank, world, local = (int(os.environ[v]) for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    # torchrun's agent started this rank: if the agent dies (even SIGKILL), the rank goes too. A follower ignores
    # SIGTERM (`follow`: rank 0 decides when the run ends), so it asks for SIGKILL: with SIGTERM, a follower whose
    # agent was killed (a test's timeout) waited in its collective for good, holding its memory and its port
    die_with_parent(sig=signal.SIGTERM if rank == 0 else signal.SIGKILL)
    if cfg.parallel.strategy == "none":
        if world > 1:
            raise DistributedSetupError(
                f"parallel.strategy is none but this is rank {rank} of {world}: set fsdp2 or ddp, or start 1 process"
            )
        return None
    if not torch.distributed.is_available():
        raise DistributedSetupError("this torch build has no torch.distributed; a multi-process learner needs it")
    device = resolve_device(cfg.model.device)
    backend = _backend(cfg, device)
    if device.type == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    torch.distributed.init_process_group(
        backend,
        timeout=timedelta(seconds=cfg.parallel.timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    _CURRENT = Ranks(cfg, rank, world, device, Channel(device))
    return _CURRENT


def attach(learner: Learner) -> None:
    """Rank 0: share `learner` (built, and restored on resume) with the other ranks. One process: nothing."""
    ranks = _CURRENT
    if ranks is None:
        return
    from heterorl.parallel.ranks import attach_learner, learner_meta

    meta = learner_meta(learner)
    ranks.channel.send(Op.ATTACH, to_json_bytes(meta))
    attach_learner(learner, ranks.cfg.parallel.strategy, ranks.channel, meta)


def follower_learner(cfg: RunConfig) -> Learner:
    """A follower's learner: the configured architecture (`model.path`, or the model built in code); its weights
    arrive from rank 0, so a follower never builds the warm start."""
    device = resolve_device(cfg.model.device)
    chat = cfg.task.chat_template
    if cfg.model.path is not None:
        return Learner(Policy.load(cfg.model.path, device, chat_template=chat), cfg)
    built = Policy.from_config(cfg.model, seed=cfg.seed)
    return Learner(Policy(built.model, built.tokenizer, device, chat), cfg)


def follow(ranks: Ranks) -> Learner:
    """A follower's whole life: build, attach, then train on rank 0's commands until STOP; returns its learner.

    SIGTERM and SIGINT are ignored: rank 0 decides when the run ends (its final checkpoint may need this rank)."""
    from heterorl.parallel.ranks import attach_learner

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    cfg = ranks.cfg
    configure_torch(cfg)
    learner = follower_learner(cfg)
    vocab = int(learner.policy.model.config.vocab_size)
    while True:
        op, body = ranks.channel.receive()
        if op == Op.STOP:
            return learner
        if op == Op.ATTACH:
            attach_learner(learner, cfg.parallel.strategy, ranks.channel, from_json_bytes(body))
        elif op == Op.TRAIN:
            learner.train_step(decode_groups(body, vocab))
        elif op == Op.OPTIMIZER:
            learner.optimizer_state_dict()
        else:
            raise RuntimeError(f"unknown command {op} from rank 0")


def leave_as_follower() -> NoReturn:
    """A follower rank whose run ended well (STOP received, the ranks settled, its group destroyed) exits now, without
    the interpreter's teardown: it holds nothing to save (rank 0 has the run's state), and a rank that aborted while
    its process wound down (once in CI: torchrun then stopped rank 0 as it printed the summary, failing a run that had
    finished) would fail the whole command."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def is_follower() -> bool:
    """Is this process a rank other than 0 (torchrun's RANK; one process is rank 0)?"""
    return int(os.environ.get("RANK", "0")) != 0


def run_as_rank(cfg: RunConfig, driver: Callable[[], T]) -> T | None:
    """Run `driver` here if this is the only process or rank 0 (then tell the others to stop); follow otherwise.

    On an error rank 0 sends nothing: its exit makes torchrun (or the Ray launcher) end the other ranks."""
    ranks = start(cfg)
    if ranks is None:
        return driver()
    try:
        if not ranks.leader:
            follow(ranks)
            ranks.settle()
            return None
        result = driver()
        ranks.channel.send(Op.STOP)
        ranks.settle()
        return result
    finally:
        ranks.close()
