"""What a weight update costs on a simulated link when its size is a larger model's (`cluster.modelled`).

The real store decides which bytes a sampler applies (the small model's patch or snapshot); this module decides
what they cost, as the same store would serve the modelled model: from a sampler holding version h, with the
newest snapshot at version s and the newest version v,

    patch     = frame + P * (1 - (1 - f)^(v - h)) * b      (only when the store can serve a patch from h)
    snapshot  = frame + P * S + [patch from s to v, when s < v]
    charged   = min(patch, snapshot)                       (ties go to the patch, as `WeightStore.update_for`)

with P parameters, S snapshot bytes per parameter, f the share of elements one step changes and b bytes per
changed element (`heterorl.config.modelled`). The frame is the real update's envelope header (`envelope_nbytes`
less the blobs). Whether a patch can be served at all (h retained, every record since kept, the chain within
`weights.max_chain`), the snapshot cadence and the codec are the real store's; a sampler with nothing usable gets
the snapshot. The full codec has no patches, so every update is charged a snapshot.

Beside the sizes, when the plan gives them (else zero, as in every simulated run): the learner's encode of each
version (`encode_seconds`: P * wire bytes / encode rate; the version is served that long after its step) and a
sampler's decode of each update (`decode_seconds`, at the decode rate; applied that long after it arrived), and
the size of an upload at the large model's completion lengths (`upload_nbytes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from heterorl.config import WIRE_BYTES, RunConfig, count_text
from heterorl.weights import Update, WeightStore
from heterorl.weights.envelope import envelope_nbytes


@dataclass(frozen=True)
class ModelledSizes:
    """Sizes of the modelled model's weight updates (see the module docstring)."""

    parameters: int
    snapshot_bytes_per_parameter: float
    changed_fraction: float
    bytes_per_changed: float
    wire_bytes: int  # bytes per element of the wire dtype: what raw weights cost
    encode_gb_per_second: float | None = None
    decode_gb_per_second: float | None = None
    upload_bytes_per_group: int | None = None

    @classmethod
    def from_config(cls, cfg: RunConfig) -> ModelledSizes | None:
        """The sizes `cfg.cluster.modelled` asks for, or None when the run charges its real bytes."""
        m = cfg.cluster.modelled
        if m is None:
            return None
        wire = WIRE_BYTES[cfg.weights.wire_dtype]
        per_param = wire if m.snapshot_bytes_per_parameter is None else m.snapshot_bytes_per_parameter
        return cls(
            m.parameters,
            per_param,
            m.changed_fraction,
            m.bytes_per_changed,
            wire,
            m.encode_gb_per_second,
            m.decode_gb_per_second,
            m.upload_bytes_per_group,
        )

    @property
    def full_nbytes(self) -> int:
        """The raw wire-dtype weights (what `sync/full_bytes` compares with)."""
        return self.parameters * self.wire_bytes

    @property
    def encode_seconds(self) -> float:
        """The learner's encode of one version (its diff scan and coding read the whole model), or 0."""
        return self._whole_model_seconds(self.encode_gb_per_second)

    @property
    def decode_seconds(self) -> float:
        """A sampler's checked decode of one update (its result is hashed whole), or 0."""
        return self._whole_model_seconds(self.decode_gb_per_second)

    def _whole_model_seconds(self, gb_per_second: float | None) -> float:
        return 0.0 if gb_per_second is None else self.full_nbytes / (gb_per_second * 1e9)

    def upload_nbytes(self, body: bytes, groups: tuple[bytes, ...]) -> int:
        """An upload's size on the wire: its frame and header as sent, each group at `upload_bytes_per_group`
        (or the real bytes when the plan does not give it)."""
        if self.upload_bytes_per_group is None:
            return len(body)
        return len(body) - sum(len(g) for g in groups) + len(groups) * self.upload_bytes_per_group

    @property
    def snapshot_nbytes(self) -> int:
        return round(self.parameters * self.snapshot_bytes_per_parameter)

    def patch_nbytes(self, steps: int) -> int:
        """A patch over `steps` learner steps (merged): the union of what they changed, `bytes_per_changed` each."""
        if steps <= 0:
            return 0
        changed = 1.0 - (1.0 - self.changed_fraction) ** steps
        return round(self.parameters * changed * self.bytes_per_changed)

    def update_nbytes(self, update: Update, store: WeightStore, held: tuple[int | None, str | None]) -> int:
        """What `update` (the store's answer to a sampler holding `held`) costs on the wire at the modelled size;
        call it with the store still at `update.version` (before the next publish)."""
        frame = envelope_nbytes(update) - update.nbytes
        snap = store.snapshot_version
        assert snap is not None, "nothing published"
        assert snap <= update.version, f"store snapshot {snap}, update to v{update.version}"
        snapshot = self.snapshot_nbytes + self.patch_nbytes(update.version - snap)
        held_version = held[0]
        if held_version is None or not store.can_patch_from(*held):
            return frame + snapshot
        return frame + min(self.patch_nbytes(update.version - held_version), snapshot)


def modelled_note(cfg: RunConfig, computed_parameters: int) -> str | None:
    """The one line that labels a run with `cluster.modelled` (printed at its start and end, in run.log,
    summary.json and `heterorl report`); None for a run that charges its real bytes."""
    m, sizes = cfg.cluster.modelled, ModelledSizes.from_config(cfg)
    if m is None or sizes is None:
        return None
    costs = []
    if sizes.encode_seconds > 0.0:
        costs.append(f"encode {sizes.encode_seconds:.3g} s per version")
    if sizes.decode_seconds > 0.0:
        costs.append(f"decode {sizes.decode_seconds:.3g} s per update")
    if sizes.upload_bytes_per_group is not None:
        costs.append(f"uploads {sizes.upload_bytes_per_group / 1e3:.3g} kB per group")
    extra = "".join(f", {c}" for c in costs)
    return (
        f"modelled, not computed: weight updates sized for {m.label()} ({count_text(m.parameters)} parameters: "
        f"snapshot {sizes.snapshot_nbytes / 1e9:.3g} GB, one step's patch {sizes.patch_nbytes(1) / 1e6:.3g} MB"
        f"{extra}) and the configured compute costs; the computation (training, generation, rewards, the bytes "
        f"applied) used the small model ({count_text(computed_parameters)} parameters)"
    )
