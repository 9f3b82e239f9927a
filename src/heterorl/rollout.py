"""RolloutGroup, the unit that travels from a sampler to the learner, and its packing into padded tensors."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    """Stack groups into one left/right-padded batch (prompts left-padded, completions right-padded)."""
    if not groups:
        raise ValueError("cannot pack an empty list of groups")
    P = max(g.prompt_ids_P.shape[0] for g in groups)
    L = max(g.completion_ids_GL.shape[1] for g in groups)
    prompt_ids, prompt_mask, comp, comp_mask, logp, version, index = [], [], [], [], [], [], []
    for gi, g in enumerate(groups):
        G, n = g.size, g.prompt_ids_P.shape[0]
        pad_p, pad_l = P - n, L - g.completion_ids_GL.shape[1]
        prompt_ids.append(torch.nn.functional.pad(g.prompt_ids_P, (pad_p, 0), value=pad_id).expand(G, P))
        prompt_mask.append(
            torch.cat([torch.zeros(pad_p, dtype=torch.long), torch.ones(n, dtype=torch.long)]).expand(G, P)
        )
        comp.append(torch.nn.functional.pad(g.completion_ids_GL, (0, pad_l), value=pad_id))
        comp_mask.append(torch.nn.functional.pad(g.completion_mask_GL, (0, pad_l), value=0))
        logp.append(torch.nn.functional.pad(g.behavior_logp_GL, (0, pad_l), value=0.0))
        version.append(torch.nn.functional.pad(g.version_GL, (0, pad_l), value=int(g.version_GL.max())))
        index.append(torch.full((G,), gi, dtype=torch.long))
    return Batch(
        prompt_ids_BP=torch.cat(prompt_ids),
        prompt_mask_BP=torch.cat(prompt_mask),
        completion_ids_BL=torch.cat(comp),
        completion_mask_BL=torch.cat(comp_mask),
        behavior_logp_BL=torch.cat(logp),
        version_BL=torch.cat(version),
        rewards_B=torch.cat([g.rewards_G for g in groups]),
        group_index_B=torch.cat(index),
    )
