"""A large-cluster plan: the simulator computes with the config's small model while the weight updates' sizes are
those of a larger one (`cluster.modelled`).

Everything real stays real: the small model trains, samplers generate with it, rewards are computed, and the
bytes a sampler applies are the small model's own patches and snapshots. What a weight update costs on a simulated
link -- its size, hence its transfer time through the learner's uplink and the sampler's path, and the traffic
figures -- is the large model's (`heterorl.transport.simulated.modelled`):

    snapshot = parameters * snapshot_bytes_per_parameter
    patch over k learner steps = parameters * (1 - (1 - changed_fraction)^k) * bytes_per_changed

(a merged patch rewrites the union of what k steps changed, each step changing an independent `changed_fraction`
of the elements: an upper bound, since positions that step back cancel). Optionally, what the large model's
updates and rollouts cost beside their transfer:

    encode at the learner  = parameters * wire bytes / encode_gb_per_second     (every published version)
    decode at a sampler    = parameters * wire bytes / decode_gb_per_second     (every update it applies)
    an upload              = its frame + groups * upload_bytes_per_group         (instead of the small groups' bytes)

Compute costs are the cluster's own fields, set to the large model's figures: `cluster.learner_step_seconds`,
`learner_seconds_per_token`, `learner_seconds_per_group` and each sampler's `tokens_per_second`. Live clusters
refuse the section (`heterorl.live.preflight`): a real network carries the real bytes.
"""

from __future__ import annotations

from pydantic import Field

from heterorl.config.base import Strict

WIRE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}  # bytes per element of `weights.wire_dtype`


class ModelledConfig(Strict):
    """The model whose weight-update sizes the simulated links charge (see the module docstring)."""

    name: str | None = Field(
        None,
        min_length=1,
        max_length=80,
        description="What is modelled, for the labels (e.g. 'a 7B model in bf16'); None: its parameter count.",
    )
    parameters: int = Field(..., ge=1, le=10**13, description="Parameter count of the modelled model.")
    snapshot_bytes_per_parameter: float | None = Field(
        None,
        gt=0.0,
        le=8.0,
        description="Bytes per parameter of a full snapshot; None: the wire dtype's size (`weights.wire_dtype`, raw). "
        "PULSE's byte-plane snapshot measured 1.37 at 1e9 bf16 parameters (docs/weight-sync.md).",
    )
    changed_fraction: float = Field(
        0.01,
        gt=0.0,
        le=1.0,
        description="Share of the wire-dtype elements one learner step changes, as measured at that size and "
        "learning rate (a run's `sync/changed_share`, or `heterorl sync bench`): ~1% for GRPO in bf16 at lr ~1e-6; "
        "2.6% on Qwen3 ~90M at lr 1e-6 (docs/weight-sync.md).",
    )
    bytes_per_changed: float = Field(
        1.164,
        gt=0.0,
        le=16.0,
        description="Patch bytes per changed element: 1.164 measured at 1e9 parameters with 1% changes, 1.008 with "
        "4.2% (codec pulse; pulse-ctx ~0.78 at 2.6%; docs/weight-sync.md).",
    )

    encode_gb_per_second: float | None = Field(
        None,
        gt=0.0,
        le=10_000.0,
        description="GB of the modelled raw weights (parameters x wire-dtype bytes) the learner's publish encodes per "
        "second (diff scan, patch and snapshot coding): a version is served that long after its step, beside the "
        "next step, and a step's commit waits for the previous publish. heterorl's kernels per CPU-second on a 2-core "
        "VM: ~2.6-4.8 GB/s (pulse), ~0.8-1.6 (pulse-ctx) (`benchmarks/codec_speed.py`). None: encoding takes no "
        "virtual time.",
    )
    decode_gb_per_second: float | None = Field(
        None,
        gt=0.0,
        le=10_000.0,
        description="GB of the modelled raw weights a sampler decodes and checks per second: an update is applied "
        "that long after it arrived, while the sampler keeps generating with what it holds. A checked patch decode per "
        "CPU-second on a 2-core VM: ~2.5-4.2 GB/s (pulse), ~1.3-1.7 (pulse-ctx) (`benchmarks/codec_speed.py`). None: "
        "decoding takes no virtual time.",
    )
    upload_bytes_per_group: int | None = Field(
        None,
        ge=1,
        le=10**10,
        description="Bytes of one rollout group's upload at the modelled model's completion lengths (about 12 per "
        "token: id, behaviour log-prob, version, as `heterorl.rollout_codec` encodes them, before compression); "
        "None: uploads cost the small model's real bytes.",
    )

    def label(self) -> str:
        """`a 7B model in bf16`, or `7B parameters` when unnamed."""
        return self.name or f"{count_text(self.parameters)} parameters"


def count_text(n: float) -> str:
    """A count in 3 significant digits with its scale: 7e9 -> `7B`, 301568 -> `302K`."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}"
