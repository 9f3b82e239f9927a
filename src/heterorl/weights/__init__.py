"""Learner -> sampler weight synchronisation: lossless sparse patches (PULSE), snapshots, a versioned store.

    store = WeightStore.from_config(cfg.weights)      # learner
    store.publish(version, bf16_state_dict)
    update = store.update_for(*receiver.held())        # sampler (charge update.nbytes to the link)
    receiver.apply(update)                             # False -> it asks for a snapshot next time

See docs/weight-sync.md for the byte format, the guarantees and measured sizes/speeds.
"""

from heterorl.weights.codecs import CODECS, EncodedPatch, FullCodec, PulseCodec, PulseCtxCodec, SyncCodec, make_codec
from heterorl.weights.format import PatchError, StateDict
from heterorl.weights.hashing import state_hash
from heterorl.weights.patch import (
    PatchInfo,
    apply_patch,
    encode_patch,
    encode_patches,
    merge_patches,
    patch_info,
    recode_patch,
)
from heterorl.weights.snapshot import apply_snapshot, encode_snapshot, load_snapshot
from heterorl.weights.store import Published, Update, WeightReceiver, WeightStore

__all__ = [
    "CODECS",
    "EncodedPatch",
    "FullCodec",
    "PatchError",
    "PatchInfo",
    "Published",
    "PulseCodec",
    "PulseCtxCodec",
    "StateDict",
    "SyncCodec",
    "Update",
    "WeightReceiver",
    "WeightStore",
    "apply_patch",
    "apply_snapshot",
    "encode_patch",
    "encode_patches",
    "encode_snapshot",
    "load_snapshot",
    "make_codec",
    "merge_patches",
    "patch_info",
    "recode_patch",
    "state_hash",
]
