"""The part of a run's config a sampler and its learner must agree on, as one short hash per setting.

A sampler started with another task, another group size or a stale copy of the config would otherwise feed the
learner groups it trains on without a trace. Every upload carries its sampler's fingerprint (`loop.protocol`);
the learner compares it with its own and refuses the upload (`config_mismatch`), naming the settings that
differ. What must agree:

- `task.*`: the prompts, their answers and the reward (a custom `task.reward` included);
- `model.*` but where it lives (`path`, `device`): the architecture the weights are for, LoRA, the wire format;
- `sampler.*` but the rollout engine (`sampler.engine`, a host's own choice): group size, sampling (temperature,
  top-k, top-p, max_new_tokens), interruptible rollouts, frictions;
- `learner.groups_per_step` (a synchronous sampler's share), `weights.codec` and `weights.wire_dtype` (the
  updates it decodes), and `cluster`'s mode, staleness control and sampler names.

Values are hashed (blake2b, 4 bytes, of their JSON), so a fingerprint says which settings differ, not what they
are; each side prints its own values.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from heterorl.config.run import RunConfig

_SECTIONS: dict[str, tuple[str, ...] | None] = {"task": None, "model": None, "sampler": None}
_EXCLUDED = {"model.path", "model.device", "sampler.engine"}
_SINGLE = (
    "learner.groups_per_step",
    "weights.codec",
    "weights.wire_dtype",
    "cluster.mode",
    "cluster.eta",
    "cluster.max_staleness",
    "cluster.max_queued_steps",
)


def agreed_settings(cfg: RunConfig) -> dict[str, Any]:
    """The settings a sampler and its learner must share, as dotted keys -> JSON values."""
    dumped = cfg.model_dump(mode="json")
    out: dict[str, Any] = {}
    for section in _SECTIONS:
        for key, value in dumped[section].items():
            dotted = f"{section}.{key}"
            if dotted not in _EXCLUDED:
                out[dotted] = value
    for dotted in _SINGLE:
        section, key = dotted.split(".")
        out[dotted] = dumped[section][key]
    out["cluster.samplers.names"] = cfg.cluster.sampler_names()
    return out


def fingerprint(cfg: RunConfig) -> dict[str, str]:
    """dotted key -> 8 hex digits of its value (`agreed_settings`)."""
    return {key: _digest(value) for key, value in sorted(agreed_settings(cfg).items())}


def differences(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """The keys whose hashes differ, or that only one side has, sorted."""
    return sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(text, digest_size=4).hexdigest()
