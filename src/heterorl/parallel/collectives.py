"""Bytes between the ranks of a learner, as uint8 tensors (never pickle: no `broadcast_object_list`).

Rank 0 tells the other ranks what to do next through a `Channel`: a command header [op, nbytes] and a body. The
body of a training step is the step's rollout groups in their wire format (`rollout_codec.encode_group`), each
framed with its length and xxh3 checksum as in the journal, so every rank decodes and validates the same bytes.
"""

from __future__ import annotations

import json
from enum import IntEnum
from typing import Any

import torch
import torch.distributed as dist

from heterorl.durable.journal import frame, parse_records
from heterorl.rollout import RolloutGroup
from heterorl.rollout_codec import GroupLimits, decode_group, encode_group


class Op(IntEnum):
    """What rank 0 asks of the other ranks; each is followed by the same collectives on every rank."""

    ATTACH = 1  # body: JSON of the learner's version, schedule and optimizer layout; weights follow
    TRAIN = 2  # body: the step's groups
    OPTIMIZER = 3  # gather the sharded AdamW state on rank 0 (a durable state is being written)
    STOP = 4  # the run is over


class Channel:
    """Rank 0 -> every rank, one command at a time, on `device` (NCCL moves CUDA tensors only)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def send(self, op: Op, body: bytes = b"") -> None:
        dist.broadcast(torch.tensor([int(op), len(body)], dtype=torch.int64, device=self.device), src=0)
        if body:
            dist.broadcast(_to_tensor(body, self.device), src=0)

    def receive(self) -> tuple[Op, bytes]:
        header = torch.zeros(2, dtype=torch.int64, device=self.device)
        dist.broadcast(header, src=0)
        op, nbytes = (int(v) for v in header.tolist())
        if nbytes == 0:
            return Op(op), b""
        body = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        dist.broadcast(body, src=0)
        return Op(op), body.cpu().numpy().tobytes()


def _to_tensor(data: bytes, device: torch.device) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)


def all_gather_bytes(data: bytes, device: torch.device) -> list[bytes]:
    """Every rank's `data`, in rank order (lengths first, then the bodies padded to the longest)."""
    world = dist.get_world_size()
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(length) for _ in range(world)]
    dist.all_gather(lengths, length)
    longest = max(int(n) for n in lengths)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: len(data)] = _to_tensor(data, device) if data else padded[:0]
    bodies = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(bodies, padded)
    return [b[: int(n)].cpu().numpy().tobytes() for b, n in zip(bodies, lengths, strict=True)]


def encode_groups(groups: list[RolloutGroup]) -> bytes:
    return b"".join(frame(encode_group(g)) for g in groups)


def decode_groups(body: bytes, vocab_size: int) -> list[RolloutGroup]:
    """The groups rank 0 sent: framing and checksums are checked, and each group is validated again."""
    records, end = parse_records(body)
    if end != len(body):
        raise ValueError(f"a training step's groups are torn: {end} of {len(body)} bytes intact")
    limits = GroupLimits(
        vocab_size=vocab_size,
        current_version=2**31 - 1,  # rank 0 checked the versions against what it had published
        max_prompt_tokens=2**31 - 1,
        max_completion_tokens=2**31 - 1,
        max_total_tokens=2**31 - 1,
    )
    return [decode_group(r, limits) for r in records]


def to_json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()


def from_json_bytes(data: bytes) -> Any:
    return json.loads(data.decode())
