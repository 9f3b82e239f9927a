"""RolloutGroup on the wire: an explicit binary format (never pickle), validated before anything is trusted.

Layout (little-endian):

    magic b"HRG1" | u32 header length | JSON header (utf-8) | arrays, back to back, in header order
    arrays: prompt_ids int32[P] | completion_ids int32[G, L] | lengths int32[G] | behavior_logp float32[G, L]
            | version int32[G, L] | rewards float32[G]

The completion mask is not sent: it is the prefix of `lengths[i]` tokens of each row (what a sampler produces).
`decode_group` checks the framing (magic, lengths, JSON, declared shapes against the byte count), then the content
with `validate_arrays`: token ids inside the vocabulary, lengths within limits, log-probs on sampled tokens in
[`min_logprob`, 0], versions not from the future, group size, rewards within [`min_reward`, `max_reward`], text
fields of bounded length. Anything wrong raises `RolloutError` with a message saying what; a receiver counts it
and carries on.

Finite is not enough for a learner: one behaviour log-prob of -1e4 makes an importance ratio exp(1e4) = inf, and
rewards of 3e38 overflow the advantage's mean, and either turns every weight into NaN at the next step. The
log-prob floor is what a sampler can emit: it samples from float32 probabilities, and below log(2^-150) ~ -103.97
a float32 probability is exactly 0, a token that is never drawn (`learner.min_behavior_logprob`, default -104).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import torch

from heterorl.framing import frame, non_negative_int, unframe
from heterorl.rollout import RolloutGroup

MAGIC = b"HRG1"
MAX_HEADER_BYTES = 1 << 16
MAX_INFO_KEYS = 16
MAX_ANSWER_CHARS = 4096
MAX_PROMPT_CHARS_PER_TOKEN = 64  # a prompt text is re-tokenized to its ids, so it cannot be much longer than them
_INFO_KEY = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class RolloutError(ValueError):
    """A rollout group that cannot be decoded or fails validation; `reason` is the counted category:
    malformed (framing), too_long, out_of_vocab, bad_logprobs, future_version, group_size, bad_rewards, invalid."""

    def __init__(self, message: str, reason: str = "malformed") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class GroupLimits:
    """What a learner accepts: its vocabulary, the newest version it has published, group and length bounds."""

    vocab_size: int
    current_version: int
    group_size: int | None = None  # required G, None = any
    max_prompt_tokens: int = 4096
    max_completion_tokens: int = 4096
    max_total_tokens: int = 8192  # prompt + completion: the model's context (position embeddings)
    min_logprob: float = -104.0  # below log(2^-150) a float32 probability is 0: never sampled
    min_reward: float = -1e4
    max_reward: float = 1e4


def max_message_bytes(limits: GroupLimits) -> int | None:
    """The largest message `decode_group` can accept under `limits` (None when the group size is open): a body
    bound tighter than any configured one, so a peer cannot make the learner buffer more than a real group."""
    if limits.group_size is None:
        return None
    G = limits.group_size
    L = max(0, min(limits.max_completion_tokens, limits.max_total_tokens - 1))
    P = max(1, min(limits.max_prompt_tokens, limits.max_total_tokens - L))
    return len(MAGIC) + 4 + MAX_HEADER_BYTES + 4 * (P + 3 * G * L + 2 * G)


def encode_group(group: RolloutGroup) -> bytes:
    """Serialise a group (mask rows must be contiguous prefixes, as generation produces them)."""
    lengths = group.completion_mask_GL.sum(1).to(torch.int32)
    G, L = group.completion_ids_GL.shape
    header = {
        "group_id": group.group_id,
        "sampler_id": group.sampler_id,
        "prompt": group.prompt,
        "answer": group.answer,
        "P": int(group.prompt_ids_P.shape[0]),
        "G": int(G),
        "L": int(L),
        "created_at": float(group.created_at),
        "finished_at": float(group.finished_at),
        "info": dict(group.info),
    }
    values = {
        "prompt_ids": group.prompt_ids_P,
        "completion_ids": group.completion_ids_GL,
        "lengths": lengths,
        "behavior_logp": group.behavior_logp_GL,
        "version": group.version_GL,
        "rewards": group.rewards_G,
    }
    specs = _array_specs(header["P"], G, L)
    body = b"".join(np.ascontiguousarray(values[name].numpy(), dtype=dtype).tobytes() for name, dtype, _ in specs)
    return frame(MAGIC, header, body)


def _array_specs(P: int, G: int, L: int) -> list[tuple[str, str, tuple[int, ...]]]:
    return [
        ("prompt_ids", "<i4", (P,)),
        ("completion_ids", "<i4", (G, L)),
        ("lengths", "<i4", (G,)),
        ("behavior_logp", "<f4", (G, L)),
        ("version", "<i4", (G, L)),
        ("rewards", "<f4", (G,)),
    ]


def _parse_header(data: bytes) -> tuple[dict, int]:
    header, offset = unframe(data, MAGIC, MAX_HEADER_BYTES, RolloutError)
    for key, kind in (("group_id", str), ("sampler_id", str), ("prompt", str), ("answer", str)):
        if not isinstance(header.get(key), kind):
            raise RolloutError(f"header field {key!r} missing or not a {kind.__name__}")
    for key in ("P", "G", "L"):
        non_negative_int(header, key, RolloutError)
    for key in ("created_at", "finished_at"):
        value = header.get(key, 0.0)
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise RolloutError(f"header field {key!r} must be a finite number")
    info = header.get("info", {})
    if not isinstance(info, dict) or len(info) > MAX_INFO_KEYS:
        raise RolloutError(f"header field 'info' must be an object of at most {MAX_INFO_KEYS} counts")
    for key, count in info.items():
        if not _INFO_KEY.match(key) or not isinstance(count, int) or isinstance(count, bool):
            raise RolloutError(f"info entry {key[:40]!r} must be a lower-case name with an integer count")
        if not 0 <= count <= header["G"]:
            raise RolloutError(f"info count {key}={count} is not in [0, G]")
    return header, offset


def decode_group(data: bytes, limits: GroupLimits) -> RolloutGroup:
    """Parse and validate a group; raises RolloutError on anything malformed or out of bounds."""
    header, offset = _parse_header(data)
    P, G, L = header["P"], header["G"], header["L"]
    if max(P - limits.max_prompt_tokens, L - limits.max_completion_tokens, P + L - limits.max_total_tokens) > 0:
        raise RolloutError(f"prompt {P} / completion {L} tokens exceed the limits", "too_long")
    if len(header["prompt"]) > MAX_PROMPT_CHARS_PER_TOKEN * max(P, 1) or len(header["answer"]) > MAX_ANSWER_CHARS:
        raise RolloutError(f"prompt of {len(header['prompt'])} characters for {P} tokens, or a long answer", "too_long")
    specs = _array_specs(P, G, L)
    expected = offset + sum(math.prod(shape) * 4 for _, _, shape in specs)
    if len(data) != expected:
        raise RolloutError(f"message has {len(data)} bytes, its header declares {expected}")
    arrays: dict[str, np.ndarray] = {}
    for name, dtype, shape in specs:
        count = math.prod(shape)
        arrays[name] = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
        offset += count * 4
    lengths = arrays["lengths"].astype(np.int64)  # numpy: each torch op on arrays this small costs several times more
    if ((lengths < 1) | (lengths > L)).any():
        raise RolloutError(f"completion lengths must be in [1, {L}]")
    mask = np.arange(L)[None, :] < lengths[:, None]
    prompt_ids, completion_ids = arrays["prompt_ids"].astype(np.int64), arrays["completion_ids"].astype(np.int64)
    logp, version = arrays["behavior_logp"].astype(np.float32), arrays["version"].astype(np.int64)
    rewards = arrays["rewards"].astype(np.float32)
    validate_arrays(prompt_ids, completion_ids, mask, logp, version, rewards, limits)  # before any tensor exists
    return RolloutGroup(
        group_id=header["group_id"],
        sampler_id=header["sampler_id"],
        prompt=header["prompt"],
        answer=header["answer"],
        prompt_ids_P=torch.from_numpy(prompt_ids),
        completion_ids_GL=torch.from_numpy(completion_ids),
        completion_mask_GL=torch.from_numpy(mask.astype(np.int64)),
        behavior_logp_GL=torch.from_numpy(logp),
        version_GL=torch.from_numpy(version),
        rewards_G=torch.from_numpy(rewards),
        created_at=float(header.get("created_at", 0.0)),
        finished_at=float(header.get("finished_at", 0.0)),
        info=dict(header.get("info", {})),
    )


def validate_arrays(
    prompt_ids_P: np.ndarray,
    completion_ids_GL: np.ndarray,
    mask_GL: np.ndarray,
    logp_GL: np.ndarray,
    version_GL: np.ndarray,
    rewards_G: np.ndarray,
    limits: GroupLimits,
) -> None:
    """Check a group's content (its arrays as `decode_group` read them: `mask_GL` boolean, `logp_GL` and
    `rewards_G` float32) against what the learner accepts; raises RolloutError naming the problem. In numpy, before
    any tensor exists: a torch op on arrays this small costs several times a numpy one."""
    G = completion_ids_GL.shape[0]
    if G < 1 or rewards_G.shape != (G,):
        raise RolloutError(f"group has {G} completions and {tuple(rewards_G.shape)} rewards", "invalid")
    if limits.group_size is not None and limits.group_size != G:
        raise RolloutError(f"group size {G}, the learner expects {limits.group_size}", "group_size")
    if prompt_ids_P.size < 1:
        raise RolloutError("empty prompt", "invalid")
    for name, ids in (("prompt", prompt_ids_P), ("completion", completion_ids_GL)):
        if ids.size and (ids.min() < 0 or ids.max() >= limits.vocab_size):
            raise RolloutError(f"{name} token id outside the vocabulary [0, {limits.vocab_size})", "out_of_vocab")
    logp = logp_GL[mask_GL]
    if not ((logp >= limits.min_logprob) & (logp <= 0)).all():  # NaN fails both comparisons
        raise RolloutError(
            f"behaviour log-probs must be in [{limits.min_logprob:g}, 0] on sampled tokens (what a sampler can emit)",
            "bad_logprobs",
        )
    versions = version_GL[mask_GL]
    if versions.size and (versions.min() < 0 or versions.max() > limits.current_version):
        low, high = int(versions.min()), int(versions.max())
        raise RolloutError(
            f"token versions in [{low}, {high}] are not in [0, {limits.current_version}]", "future_version"
        )
    if not ((rewards_G >= limits.min_reward) & (rewards_G <= limits.max_reward)).all():
        raise RolloutError(f"rewards must be in [{limits.min_reward:g}, {limits.max_reward:g}]", "bad_rewards")
