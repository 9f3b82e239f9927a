"""A learner spread over torch.distributed ranks: FSDP2 (`fully_shard`) or DDP under the one `Learner.train_step`.

`attach_learner` turns a built learner into one rank of N:
- rank 0's weights (fresh, or restored from a durable state) and its reference model are broadcast, so every rank
  starts from the same bits whatever it loaded;
- ddp: the model is wrapped in DistributedDataParallel (gradients all-reduced in the last backward of a
  minibatch); every rank holds the full model and AdamW's moments, broadcast from rank 0;
- fsdp2: every decoder layer and then the root are `fully_shard`ed (parameters, gradients and AdamW moments are
  1/N per rank; rank 0's moments are scattered into shards); rank 0 keeps an unsharded fp32 copy, refreshed after
  every step from the shards, which is what it publishes, evaluates and checkpoints, on the device it trains on.
`RankSharding` supplies the hooks of `heterorl.parallel.sharding.Sharding` (which micro-batches are this rank's,
gradient synchronisation only in the last one, statistics summed over ranks).
"""

from __future__ import annotations

import copy
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.parallel import DistributedDataParallel

from heterorl.learner import Learner
from heterorl.microbatch import StatsAccumulator
from heterorl.parallel.collectives import Channel, Op, all_gather_bytes, encode_groups, from_json_bytes, to_json_bytes
from heterorl.parallel.sharding import Micro, Sharding, plan_micro_batches, split_groups
from heterorl.policy import Policy
from heterorl.rollout import Batch, RolloutGroup


class RankSharding(Sharding):
    """This rank's share of every learner step (see the module docstring)."""

    def __init__(self, learner: Learner, strategy: str, channel: Channel, replica: torch.nn.Module | None) -> None:
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.leader = self.rank == 0
        self.grad_scale = float(self.world)  # both DDP and FSDP2 divide the summed gradient by the world size
        self.learner, self.strategy, self.channel, self.replica = learner, strategy, channel, replica

    def begin_step(self, groups: list[RolloutGroup]) -> list[RolloutGroup]:
        if self.leader:
            self.channel.send(Op.TRAIN, encode_groups(groups))
        return groups

    def micro_batches(
        self, batch: Batch, rows_B: torch.Tensor, budget: int | None, loss_mask_BL: torch.Tensor
    ) -> list[Micro]:
        return plan_micro_batches(batch, rows_B, budget, loss_mask_BL, self.rank, self.world)

    def local_rows(self, batch: Batch, loss_mask_BL: torch.Tensor) -> torch.Tensor:
        """This rank's rows of every minibatch (the same deal as `micro_batches`); a stand-in row when it has none,
        because under FSDP2 every rank must run the proximal forward pass."""
        minibatches = _minibatch_rows(batch, self.learner.cfg.updates_per_batch)
        rows = torch.cat([split_groups(batch, mb, self.world)[self.rank] for mb in minibatches])
        return rows if rows.numel() else torch.zeros(1, dtype=torch.long, device=rows.device)

    def accumulating(self, last: bool) -> AbstractContextManager[Any]:
        module = self.learner.train_policy.model
        if self.strategy == "fsdp2":
            module.set_requires_gradient_sync(last)
            return nullcontext()
        return nullcontext() if last else module.no_sync()

    def reduce_stats(self, acc: StatsAccumulator) -> StatsAccumulator:
        """Share-weighted sums and weights add up over ranks; `*_max` statistics take the maximum."""
        mine = to_json_bytes({"sums": acc.sums, "weights": acc.weights})
        merged = StatsAccumulator()
        for data in all_gather_bytes(mine, self.channel.device):
            other = from_json_bytes(data)
            for key, value in other["sums"].items():
                if key.endswith("_max"):
                    merged.sums[key] = max(merged.sums.get(key, value), value)
                    merged.weights[key] = 1.0
                else:
                    merged.sums[key] += value
                    merged.weights[key] += other["weights"][key]
        return merged

    def end_step(self) -> None:
        """FSDP2: gather every trainable parameter (all ranks) into rank 0's full copy."""
        if self.strategy == "fsdp2":
            gather_into(self.learner.train_module, self.replica)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        if self.strategy != "fsdp2":
            return optimizer.state_dict()  # DDP: every rank holds the full state
        if self.leader:
            self.channel.send(Op.OPTIMIZER)
        sd = optimizer.state_dict()
        full: dict[int, dict[str, Any]] = {}
        for index in sorted(sd["state"]):
            full[index] = {}
            for key in sorted(sd["state"][index]):
                value = sd["state"][index][key]
                full[index][key] = value.full_tensor() if isinstance(value, DTensor) else value
        return {"state": full, "param_groups": sd["param_groups"]}


def _minibatch_rows(batch: Batch, updates_per_batch: int) -> list[torch.Tensor]:
    """The rows of each minibatch, as `Learner.train_step` cuts the batch."""
    groups = int(batch.group_index_B.max()) + 1
    index_B = batch.group_index_B
    return [
        torch.isin(index_B, chunk.to(index_B.device)).nonzero().squeeze(-1)
        for chunk in torch.arange(groups).chunk(updates_per_batch)
    ]


@torch.no_grad()
def gather_into(sharded: torch.nn.Module, replica: torch.nn.Module | None) -> None:
    """Every trainable parameter of the FSDP2 module, gathered in full (a collective) and copied into `replica`
    (rank 0) one tensor at a time, so no rank ever holds a second full model in flight."""
    targets = dict(replica.named_parameters()) if replica is not None else {}
    for name, p in sharded.named_parameters():
        if not p.requires_grad:
            continue
        full = p.full_tensor()
        if replica is not None:
            targets[name].copy_(full)


# ---------------------------------------------------------------- attaching a learner
def _optimizer_layout(learner: Learner) -> list[list[Any]]:
    """[param index, key, shape, dtype] of every tensor in AdamW's state, in a fixed order."""
    layout = []
    for index, p in enumerate(learner.trainable):
        for key in sorted(learner.optimizer.state.get(p, {})):
            value = learner.optimizer.state[p][key]
            layout.append([index, key, list(value.shape), str(value.dtype).removeprefix("torch.")])
    return layout


def learner_meta(learner: Learner) -> dict[str, Any]:
    """What rank 0 tells the others before the weights: version, schedule, optimizer groups and state layout."""
    groups = [{k: v for k, v in g.items() if k != "params"} for g in learner.optimizer.state_dict()["param_groups"]]
    return {
        "version": learner.version,
        "scheduler": learner.scheduler.state_dict(),
        "param_groups": [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in groups],
        "optimizer_layout": _optimizer_layout(learner),
    }


@torch.no_grad()
def _broadcast_module(module: torch.nn.Module) -> None:
    for p in module.parameters():
        dist.broadcast(p.data, src=0)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks to shard one by one (transformers names their class in `_no_split_modules`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def _shard(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def attach_learner(learner: Learner, strategy: str, channel: Channel, meta: dict[str, Any]) -> None:
    """Make `learner` this rank's part of the group (every rank calls it; `meta` is rank 0's `learner_meta`)."""
    leader = dist.get_rank() == 0
    device = learner.policy.device
    previous = learner.optimizer
    _broadcast_module(learner.policy.model)
    if learner.reference is not None:
        _broadcast_module(learner.reference.model)
    learner.version = int(meta["version"])
    policy = learner.policy
    replica = None
    if strategy == "ddp":
        ids = [torch.cuda.current_device()] if device.type == "cuda" else None
        ddp = DistributedDataParallel(policy.model, device_ids=ids, broadcast_buffers=False, init_sync=False)
        learner.train_policy = Policy(ddp, policy.tokenizer, device, policy.chat_template)  # type: ignore[arg-type]
    else:
        replica = policy.model if leader else None
        train = copy.deepcopy(policy.model) if leader else policy.model
        learner.train_module = _shard(train, device)
        learner.train_policy = Policy(train, policy.tokenizer, device, policy.chat_template)  # type: ignore[arg-type]
    learner.build_optimizer()
    _load_optimizer(learner, previous if leader else None, meta)
    learner.shard = RankSharding(learner, strategy, channel, replica)


@torch.no_grad()
def _load_optimizer(learner: Learner, source: torch.optim.Optimizer | None, meta: dict[str, Any]) -> None:
    """Rank 0's AdamW state into this rank's optimizer: broadcast (DDP, scalars) or scattered into shards (FSDP2)."""
    old_params = source.param_groups[0]["params"] if source is not None else []
    for index, key, shape, dtype_name in meta["optimizer_layout"]:
        p = learner.trainable[index]
        dtype = getattr(torch, dtype_name)
        full = source.state[old_params[index]][key] if source is not None else None
        sharded = isinstance(p, DTensor) and tuple(shape) == tuple(p.shape)
        if sharded:
            local = p.to_local().device
            src = full.to(local) if full is not None else torch.empty(shape, dtype=dtype, device=local)
            value = distribute_tensor(src, p.device_mesh, p.placements)
        else:
            home = full.device if full is not None else (p.device if shape else torch.device("cpu"))
            buffer = full.clone() if full is not None else torch.empty(shape, dtype=dtype, device=home)
            moved = buffer.to(learner.policy.device) if dist.get_backend() == "nccl" else buffer
            dist.broadcast(moved, src=0)
            value = moved.to(home)
        learner.optimizer.state[p][key] = value
    for group, saved in zip(learner.optimizer.param_groups, meta["param_groups"], strict=True):
        group.update({k: tuple(v) if k == "betas" else v for k, v in saved.items()})
    learner.scheduler.load_state_dict(meta["scheduler"])
