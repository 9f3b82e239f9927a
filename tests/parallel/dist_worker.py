"""One rank of the equality test (tests/parallel/test_distributed.py), started by torchrun.

Rank 0 builds the learner as a driver does and attaches it; every other rank follows (heterorl.parallel.distributed).
Rank 0 trains on the groups in GROUPS (journal-framed `encode_group` messages, `per_step` a step) and writes the
parameters, the optimizer state and the statistics of every step to OUT; every rank writes how many parameter
elements it holds locally (`run_as_rank` is these same calls, less the report).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from heterorl.config import load_config
from heterorl.learner import Learner
from heterorl.parallel import distributed
from heterorl.parallel.collectives import decode_groups
from heterorl.policy import Policy


def main() -> None:
    model_dir, groups_file, out, per_step = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    cfg = load_config(None, sys.argv[5:])
    torch.set_num_threads(1)
    holder: dict[str, Learner] = {}

    def driver() -> None:
        learner = Learner(Policy.load(model_dir, cfg.model.device), cfg)
        distributed.attach(learner)
        holder["learner"] = learner
        groups = decode_groups(groups_file.read_bytes(), int(learner.policy.model.config.vocab_size))
        stats = [learner.train_step(groups[i : i + per_step]) for i in range(0, len(groups), per_step)]
        params = {k: v.detach().cpu().contiguous() for k, v in learner.policy.model.named_parameters()}
        save_file(params, str(out / "params.safetensors"))
        opt = learner.optimizer_state_dict()
        moments = {f"{i}.{k}": v.cpu() for i, s in opt["state"].items() for k, v in s.items() if v.dim() > 0}
        save_file(moments, str(out / "moments.safetensors"))
        (out / "stats.json").write_text(json.dumps(stats))

    ranks = distributed.start(cfg)
    assert ranks is not None, "run me under torchrun"
    try:
        if ranks.leader:
            driver()
            ranks.channel.send(distributed.Op.STOP)
            learner = holder["learner"]
        else:
            learner = distributed.follow(ranks)
        local = sum(_local(p).numel() for p in learner.train_module.parameters())
        full = sum(p.numel() for p in learner.train_module.parameters())
        (out / f"rank{ranks.rank}.json").write_text(json.dumps({"local": local, "full": full}))
        ranks.settle()  # as `run_as_rank`: every rank here before any tears the group down
    finally:
        ranks.close()
    # as `heterorl run` / `learner` followers (`leave_as_follower`): out without the interpreter's teardown, where a
    # rank hung in an exit hook (torch._dynamo's `dump_compile_times` importing tabulate) until the test's timeout
    distributed.leave_as_follower()


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


if __name__ == "__main__":
    main()
