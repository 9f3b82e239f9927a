"""RolloutGroup, the unit that travels from a sampler to the learner, and its packing into padded tensors."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class RolloutGroup:
    """One prompt, its G completions, and everything the learner needs to train on them off-policy.

    Shapes: P = prompt length (no padding), L = longest completion of the group (right-padded).
    `behavior_logp_GL` are the sampler's log-probs of its own tokens; `version_GL` the weight version that
    produced each token (constant per row unless the rollout was interrupted by a weight update).
    """

    group_id: str
    sampler_id: str
    prompt: str
    answer: str
    prompt_ids_P: torch.Tensor  # int64
    completion_ids_GL: torch.Tensor  # int64, pad after the end
    completion_mask_GL: torch.Tensor  # int64 0/1, 1 on sampled tokens (eos included)
    behavior_logp_GL: torch.Tensor  # float32, 0 where mask is 0
    version_GL: torch.Tensor  # int64
    rewards_G: torch.Tensor  # float32
    created_at: float = 0.0  # clock time generation started
    finished_at: float = 0.0  # clock time generation ended
    info: dict[str, int] = field(default_factory=dict)  # counts the sampler reports, e.g. frictions it injected

    @property
    def size(self) -> int:
        return int(self.rewards_G.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask_GL.sum())

    @property
    def min_version(self) -> int:
        """Oldest weight version that produced a token of this group (what staleness is measured against)."""
        valid = self.version_GL.cpu().numpy()[self.completion_mask_GL.cpu().numpy() != 0]  # numpy: ~5x a torch index
        return int(valid.min()) if valid.size else int(self.version_GL.min())

    def staleness(self, learner_version: int) -> int:
        return learner_version - self.min_version

    def row_bytes(self, values_GL: torch.Tensor) -> list[bytes]:
        """Each completion's values on its mask (`values_GL[g][mask[g]]`) as raw bytes, the rows the trust checks
        hash; in numpy, since a torch index per row cost ~20 us a group of 8."""
        mask = self.completion_mask_GL.cpu().numpy() != 0
        values = values_GL.detach().cpu().numpy()
        return [values[g][mask[g]].tobytes() for g in range(self.size)]


@dataclass
class Batch:
    """Groups packed for the learner: B = total completions, P = longest prompt (left-padded), L = longest
    completion (right-padded). `group_index_B` says which group each row came from."""

    prompt_ids_BP: torch.Tensor
    prompt_mask_BP: torch.Tensor
    completion_ids_BL: torch.Tensor
    completion_mask_BL: torch.Tensor
    behavior_logp_BL: torch.Tensor
    version_BL: torch.Tensor
    rewards_B: torch.Tensor
    group_index_B: torch.Tensor

    def to(self, device: torch.device) -> Batch:
        return Batch(*(t.to(device) for t in vars(self).values()))

    def select(self, rows_B: torch.Tensor, trim: bool = False) -> Batch:
        """The sub-batch of the given rows; `trim` drops the columns of completion padding no row uses."""
        sub = Batch(*(t[rows_B] for t in vars(self).values()))
        if not trim:
            return sub
        width = max(int(sub.completion_mask_BL.sum(1).max()), 1)
        cut = ("completion_ids_BL", "completion_mask_BL", "behavior_logp_BL", "version_BL")
        return Batch(**{k: (t[:, :width] if k in cut else t) for k, t in vars(sub).items()})

    @property
    def width(self) -> int:
        """Completion columns (L)."""
        return int(self.completion_ids_BL.shape[1])

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask_BL.sum())


def pack_groups(groups: list[RolloutGroup], pad_id: int) -> Batch:
    """Stack groups into one left/right-padded batch (prompts left-padded, completions right-padded; a row's
    versions padded with its group's newest). Filled in numpy, each tensor's dtype the one torch.cat would give:
    the ~10 torch ops a group took to pad cost more than the copies themselves."""
    if not groups:
        raise ValueError("cannot pack an empty list of groups")
    P = max(g.prompt_ids_P.shape[0] for g in groups)
    L = max(g.completion_ids_GL.shape[1] for g in groups)
    B = sum(g.size for g in groups)
    views = [[_host(getattr(g, name)) for name in _PACKED] for g in groups]
    dtypes = [np.result_type(*(v[i].dtype for v in views)) for i in range(5)]
    prompt_ids = np.full((B, P), pad_id, dtype=dtypes[0])
    prompt_mask = np.zeros((B, P), dtype=np.int64)
    comp = np.full((B, L), pad_id, dtype=dtypes[1])
    comp_mask = np.zeros((B, L), dtype=dtypes[2])
    logp = np.zeros((B, L), dtype=dtypes[3])
    version = np.empty((B, L), dtype=dtypes[4])
    index = np.empty(B, dtype=np.int64)
    row = 0
    for gi, (g, (ids_P, ids_GL, mask_GL, logp_GL, version_GL)) in enumerate(zip(groups, views, strict=True)):
        rows, n, width = slice(row, row + g.size), ids_P.shape[0], ids_GL.shape[1]
        prompt_ids[rows, P - n :] = ids_P
        prompt_mask[rows, P - n :] = 1
        comp[rows, :width] = ids_GL
        comp_mask[rows, :width] = mask_GL
        logp[rows, :width] = logp_GL
        version[rows, :width] = version_GL
        version[rows, width:] = version_GL.max()
        index[rows] = gi
        row += g.size
    return Batch(
        prompt_ids_BP=torch.from_numpy(prompt_ids),
        prompt_mask_BP=torch.from_numpy(prompt_mask),
        completion_ids_BL=torch.from_numpy(comp),
        completion_mask_BL=torch.from_numpy(comp_mask),
        behavior_logp_BL=torch.from_numpy(logp),
        version_BL=torch.from_numpy(version),
        rewards_B=torch.cat([g.rewards_G for g in groups]),
        group_index_B=torch.from_numpy(index),
    )


_PACKED = ("prompt_ids_P", "completion_ids_GL", "completion_mask_GL", "behavior_logp_GL", "version_GL")


def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()
