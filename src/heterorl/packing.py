"""Shared-prompt packing of the learner's teacher-forced pass (`learner.share_prompt`, off by default).

A padded batch computes every group's prompt G times and pads every row to the longest prompt + completion. Here
each group is one row: its prompt once, then its G completions back to back, unpadded,

    [p_1 .. p_n | c_1,1 .. c_1,l1 | c_2,1 .. c_2,l2 | ... | c_G,1 .. c_G,lG]      (right-padded across groups)

with position ids restarting at n for every completion and an attention mask under which a completion token sees
the prompt and the earlier tokens of its own completion only -- exactly the context it has in its own padded row
(the same idea as Prefix Grouper, arXiv 2506.05433). Each completion token is scored from the position that
predicts it: the prompt's last token for the first token of every completion, the previous token otherwise.

The log-probs, hence the loss and its gradient, are those of the padded batch up to float rounding: the sums over
tokens behind the weight gradients (and the prompt's activations, computed once and used G times) are reduced in
another order. That is why it is opt-in: runs with it are not bit-identical to runs without it. On the demo
(prompts ~5.6 tokens, completions ~3.6, G = 8) it runs ~550 token positions per step instead of 128 x 12.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from heterorl.policy import Policy, SamplingParams, filter_logits
from heterorl.rollout import Batch


@dataclass
class PackedGroups:
    """One row per group. `source_BL` is the flat position (row * T + column) whose logits predict completion
    token (b, l); positions of padding point at 0 and are masked out by the completion mask."""

    input_ids_RT: torch.Tensor
    position_ids_RT: torch.Tensor
    attention_R1TT: torch.Tensor  # bool, True = may attend
    source_BL: torch.Tensor

    @property
    def positions(self) -> int:
        """Token positions the forward pass computes (rows x width)."""
        return int(self.input_ids_RT.numel())


def pack_groups_shared(batch: Batch) -> PackedGroups:
    """Pack `batch` (rows of one group are contiguous and share the prompt; each completion mask is a prefix of
    ones) as described in the module docstring. Vectorised: index arithmetic over rows, no loop over tokens."""
    device = batch.prompt_ids_BP.device
    B, P = batch.prompt_ids_BP.shape
    L = batch.completion_ids_BL.shape[1]
    groups, counts_R = torch.unique_consecutive(batch.group_index_B, return_counts=True)
    if len(groups) != len(torch.unique(batch.group_index_B)):
        raise ValueError("the rows of each group must be contiguous to share their prompt")
    R = len(groups)
    first_R = torch.cumsum(counts_R, 0) - counts_R  # each group's first row
    row_B = torch.repeat_interleave(torch.arange(R, device=device), counts_R)  # packed row of each batch row
    n_R = batch.prompt_mask_BP[first_R].sum(1)  # prompt lengths
    l_B = batch.completion_mask_BL.sum(1)  # completion lengths
    before_B = torch.cumsum(l_B, 0) - l_B  # completion tokens of earlier rows ...
    offset_B = n_R[row_B] + before_B - before_B[first_R][row_B]  # ... of the same group: where each completion starts
    T = int((n_R + torch.zeros(R, dtype=l_B.dtype, device=device).index_add_(0, row_B, l_B)).max())

    input_ids = torch.zeros((R, T), dtype=torch.long, device=device)
    segment = torch.full((R, T), -1, dtype=torch.long, device=device)  # -1: padding, 0: prompt, i + 1: completion i
    position = torch.zeros((R, T), dtype=torch.long, device=device)
    # prompts: left-padded columns P - n .. P - 1 of the group's first row -> columns 0 .. n - 1
    col_RP = torch.arange(P, device=device) - (P - n_R)[:, None]
    keep_RP = col_RP >= 0
    rows_RP = torch.arange(R, device=device)[:, None].expand(R, P)
    input_ids[rows_RP[keep_RP], col_RP[keep_RP]] = batch.prompt_ids_BP[first_R][keep_RP]
    segment[rows_RP[keep_RP], col_RP[keep_RP]] = 0
    position[rows_RP[keep_RP], col_RP[keep_RP]] = col_RP[keep_RP]
    # completions: token s of row b -> column offset_b + s, position n + s
    s_L = torch.arange(L, device=device)
    keep_BL = batch.completion_mask_BL.bool()
    col_BL = offset_B[:, None] + s_L
    rows_BL = row_B[:, None].expand(B, L)
    member_B = torch.arange(B, device=device) - first_R[row_B]
    input_ids[rows_BL[keep_BL], col_BL[keep_BL]] = batch.completion_ids_BL[keep_BL]
    segment[rows_BL[keep_BL], col_BL[keep_BL]] = (member_B[:, None] + 1).expand(B, L)[keep_BL]
    position[rows_BL[keep_BL], col_BL[keep_BL]] = (n_R[row_B][:, None] + s_L).expand(B, L)[keep_BL]

    causal_TT = torch.ones((T, T), dtype=torch.bool, device=device).tril()
    seg_q, seg_k = segment[:, :, None], segment[:, None, :]
    visible = causal_TT & (seg_k >= 0) & ((seg_k == 0) | (seg_k == seg_q))
    visible |= torch.eye(T, dtype=torch.bool, device=device) & (seg_q < 0)  # padding sees itself: no empty row
    # token 0 is predicted by the prompt's last column, token s > 0 by the completion's token s - 1
    predictor_BL = torch.where(s_L == 0, (n_R[row_B] - 1)[:, None], col_BL - 1)
    source = torch.where(keep_BL, row_B[:, None] * T + predictor_BL, torch.zeros_like(predictor_BL))
    return PackedGroups(input_ids, position, visible[:, None], source)


def packed_token_logprobs(policy: Policy, batch: Batch, params: SamplingParams) -> torch.Tensor:
    """`Policy.token_logprobs` of `batch` ([B, L], 0 where the completion mask is 0) from one shared-prompt row per
    group; carries gradients unless called under `torch.no_grad()`."""
    packed = pack_groups_shared(batch)
    out = policy.model(
        input_ids=packed.input_ids_RT,
        attention_mask=packed.attention_R1TT,
        position_ids=packed.position_ids_RT,
        use_cache=False,
    )
    logits_RTV = out.logits
    logits_BLV = logits_RTV.reshape(-1, logits_RTV.shape[-1])[packed.source_BL]
    logp_BL = filter_logits(logits_BLV, params).gather(-1, batch.completion_ids_BL.unsqueeze(-1)).squeeze(-1)
    return torch.where(batch.completion_mask_BL.bool(), logp_BL, torch.zeros_like(logp_BL))
