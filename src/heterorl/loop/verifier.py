"""Verified rollouts: a share of the groups is re-scored under the weights they claim, with one forward pass.

A sampler reports, for every token, the version of the weights that produced it and its behaviour log-prob; both
enter every importance weight. The verifier rebuilds each claimed version (`WeightStore.weights_at`: the newest
weights with later patches reverted, hash-checked), runs prompt + completions through it in the samplers' dtype
(the sampling distribution: temperature, top-k, top-p, as the engine applies them) and checks two things:

1. The claimed log-probs are the recomputed ones: per token d = |claimed - recomputed|; a group fails
   (`logprob_mismatch`) when its mean d exceeds `mean_tolerance` or a share of its tokens over
   `token_tolerance` exceeds `max_share_over`, or a token is impossible under the claimed weights (-inf: outside
   top-k / top-p). Tolerances are calibrated per engine and dtype so that honest groups pass (docs/deployment.md).
   This catches shifted or invented log-probs, and completions from another model reported with that model's own
   log-probs.

2. The tokens look sampled from those weights (a calibration test that needs no proof from the sampler): for a
   token x drawn from distribution p, the randomised probability integral transform
       u = P(p_j > p_x) + V * P(p_j = p_x),  V ~ U(0, 1),   (mass of tokens strictly likelier, then x's tie block)
   is exactly U(0, 1), whatever p is; the u of successive tokens are independent. A group's
       z = (sum u - n/2) / sqrt(n/12)
   is then ~N(0, 1) (Irwin-Hall, bounded: no heavy tails whatever the distributions' shape). Completions from
   another model re-scored under the claimed version pass check 1 but shift u: a sharper model (greedy, better
   trained) pushes u toward 0, a flatter one toward 1. `|z| > z_tolerance` fails the group (`atypical_tokens`);
   per-sampler sums of u over many groups (`Reputation`) detect smaller shifts.

Which groups: `selected(group)` is a keyed hash (HMAC-SHA256 under a secret key) of the group's tokens (prompt and
completions) below `fraction`, so a sampler cannot tell which of its groups will be checked, and the choice is the
same under every clock (group ids carry a process's boot id, tokens do not). V comes from the same key, so a
verdict is reproducible.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from heterorl.policy import Policy, SamplingParams, filter_logits
from heterorl.rollout import RolloutGroup
from heterorl.weights import PatchError

WeightsAt = Callable[[int], Mapping[str, torch.Tensor]]


@dataclass(frozen=True)
class Tolerances:
    """Where an honest group ends (calibrated per engine and dtype; docs/deployment.md has the measurements)."""

    mean: float  # largest mean |claimed - recomputed| over a group's tokens
    token: float  # a token further off than this counts as "over"
    share_over: float  # largest share of a group's tokens over `token`
    z: float  # largest |z| of the calibration test


@dataclass(frozen=True)
class Check:
    """One group's re-score: the verdict (reason "" when it passes) and what it measured."""

    reason: str
    tokens: int
    mean_abs: float
    max_abs: float
    share_over: float
    pit_sum: float  # sum of u over the group's tokens
    z: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason


def content(group: RolloutGroup, id_rows: list[bytes] | None = None) -> bytes:
    """The group's tokens: prompt ids, then each completion's ids (length-prefixed). `id_rows`: the group's
    `row_bytes(completion_ids_GL)` when the caller has them (the screen hashes the same rows for its fingerprint)."""
    rows = group.row_bytes(group.completion_ids_GL) if id_rows is None else id_rows
    return b"".join([group.prompt_ids_P.numpy().tobytes(), *(len(row).to_bytes(8, "little") + row for row in rows)])


def uniform_key(key: bytes, message: bytes, purpose: bytes) -> int:
    """A 64-bit integer from the verifier's key and a message (HMAC-SHA256): unpredictable without the key."""
    mac = hmac.new(key, purpose + b"\x00" + message, hashlib.sha256).digest()
    return struct.unpack("<Q", mac[:8])[0]


def pit(logp_NLV: torch.Tensor, tokens_NL: torch.Tensor, noise_NL: torch.Tensor) -> torch.Tensor:
    """Randomised probability integral transform [N, L] of each token under its position's distribution (see the
    module docstring): u = P(p_j > p_x) + V * P(p_j = p_x); -inf log-probs are probability 0."""
    p_NLV = logp_NLV.exp()
    p_x = p_NLV.gather(-1, tokens_NL[..., None])  # [N, L, 1]
    above = torch.where(p_NLV > p_x, p_NLV, 0.0).sum(-1)
    tie = torch.where(p_NLV == p_x, p_NLV, 0.0).sum(-1)
    return (above + noise_NL * tie).clamp(0.0, 1.0)


class RolloutVerifier:
    """Re-scores selected groups under their claimed versions (see the module docstring).

    `policy` is the verifier's own model in the samplers' compute dtype (its weights are overwritten by each
    claimed version); `weights_at(version)` returns a version's published wire-dtype tensors (LookupError or
    PatchError when it cannot be rebuilt: the group is then not checked, and counted as `unverifiable`).
    """

    def __init__(
        self,
        policy: Policy,
        params: SamplingParams,
        weights_at: WeightsAt,
        tolerances: Tolerances,
        fraction: float,
        key: bytes,
        cache_versions: int = 2,
        max_logits: int = 2**25,
    ) -> None:
        assert 0.0 <= fraction <= 1.0, f"fraction must be in [0, 1], got {fraction}"
        self.policy, self.params, self.weights_at = policy, params, weights_at
        self.tolerances, self.fraction, self.key = tolerances, fraction, key
        self.policy.model.eval().requires_grad_(False)
        self._params = dict(self.policy.model.named_parameters())
        self._loaded: int | None = None
        self._cache: OrderedDict[int, Mapping[str, torch.Tensor]] = OrderedDict()
        self.cache_versions = cache_versions
        self.max_logits = max_logits  # logits elements of one forward chunk (memory bound)
        self.checked = self.failed = self.unverifiable = 0

    def selected(self, group: RolloutGroup, tokens: bytes | None = None) -> bool:
        """Whether this group is checked: keyed, so a sampler cannot predict it. `tokens`: its `content` when the
        caller has it (it is the same bytes that seed the check's noise)."""
        tokens = content(group) if tokens is None else tokens
        return uniform_key(self.key, tokens, b"select") < self.fraction * 2.0**64

    # ---------------------------------------------------------------- weights
    def _load(self, version: int) -> None:
        if self._loaded == version:
            return
        weights = self._cache.get(version)
        if weights is None:
            weights = self.weights_at(version)
            self._cache[version] = weights
            while len(self._cache) > self.cache_versions:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(version)
        with torch.no_grad():
            for name, tensor in weights.items():
                self._params[name].copy_(tensor)
        self._loaded = version

    # ---------------------------------------------------------------- the check
    @torch.no_grad()
    def rescore(self, group: RolloutGroup, tokens: bytes | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(recomputed log-probs [G, L], u [G, L]) of the group's tokens under their claimed versions (0 off the
        mask): one forward pass per claimed version over prompt + completions, in chunks of rows whose logits stay
        under `max_logits` elements (`tokens`: the group's `content`, when known). Raises LookupError / PatchError
        when a version cannot be rebuilt."""
        mask_GL = group.completion_mask_GL.bool()
        G, L = mask_GL.shape
        logp_GL = torch.zeros((G, L), dtype=torch.float32)
        u_GL = torch.zeros_like(logp_GL)
        tokens = content(group) if tokens is None else tokens
        gen = torch.Generator().manual_seed(uniform_key(self.key, tokens, b"pit") & (2**63 - 1))
        noise_GL = torch.rand((G, L), generator=gen)
        device, P = self.policy.device, group.prompt_ids_P.shape[0]
        vocab = int(self.policy.model.config.vocab_size)
        chunk = max(1, self.max_logits // max(1, (P + L) * vocab))
        for version in sorted(set(group.version_GL[mask_GL].tolist())):
            self._load(int(version))
            rows = (mask_GL & (group.version_GL == version)).any(1).nonzero().squeeze(-1)
            for part in rows.split(chunk):
                ids_NL = group.completion_ids_GL[part].to(device)
                mask_NL = mask_GL[part].to(device)
                input_ids = torch.cat([group.prompt_ids_P.to(device).expand(len(part), P), ids_NL], dim=1)
                attention = torch.cat([torch.ones(len(part), P, dtype=torch.long, device=device), mask_NL.long()], 1)
                with torch.inference_mode():  # the same kernels as no_grad, less autograd bookkeeping per op
                    logits, _ = self.policy._logits(input_ids, attention)
                logp_NLV = filter_logits(logits[:, P - 1 : P + L - 1], self.params)  # position t predicts t + 1
                chosen_NL = logp_NLV.gather(-1, ids_NL[..., None]).squeeze(-1)
                u_NL = pit(logp_NLV, ids_NL, noise_GL[part].to(device))
                take_NL = (mask_GL[part] & (group.version_GL[part] == version)).to(device)
                logp_GL[part] = torch.where(take_NL, chosen_NL, logp_GL[part].to(device)).float().cpu()
                u_GL[part] = torch.where(take_NL, u_NL, u_GL[part].to(device)).float().cpu()
        return logp_GL, u_GL

    def check(self, group: RolloutGroup, tokens: bytes | None = None) -> Check:
        """Re-score `group` and judge it against the tolerances (`tokens`: its `content`, when known)."""
        try:
            logp_GL, u_GL = self.rescore(group, tokens)
        except (LookupError, PatchError) as err:
            self.unverifiable += 1
            return Check("unverifiable", 0, 0.0, 0.0, 0.0, 0.0, 0.0, str(err)[:200])
        self.checked += 1
        result = judge(group, logp_GL, u_GL, self.tolerances)
        self.failed += not result.ok
        return result


def judge(group: RolloutGroup, logp_GL: torch.Tensor, u_GL: torch.Tensor, tol: Tolerances) -> Check:
    """The verdict on one group from its recomputed log-probs and u (see the module docstring)."""
    mask_GL = group.completion_mask_GL.bool()
    n = int(mask_GL.sum())
    claimed, recomputed = group.behavior_logp_GL[mask_GL].double(), logp_GL[mask_GL].double()
    if n == 0:
        return Check("", 0, 0.0, 0.0, 0.0, 0.0, 0.0)
    u_sum = float(u_GL[mask_GL].double().sum())
    z = (u_sum - n / 2) / math.sqrt(n / 12)
    if not torch.isfinite(recomputed).all():
        bad = int((~torch.isfinite(recomputed)).sum())
        return Check("logprob_mismatch", n, math.inf, math.inf, 1.0, u_sum, z, f"{bad} tokens impossible there")
    d = (claimed - recomputed).abs()
    mean_abs, max_abs = float(d.mean()), float(d.max())
    share = float((d > tol.token).double().mean())
    stats = (n, mean_abs, max_abs, share, u_sum, z)
    if mean_abs > tol.mean or share > tol.share_over:
        return Check("logprob_mismatch", *stats, f"mean |d| {mean_abs:.3g}, {share:.1%} of tokens over {tol.token}")
    if abs(z) > tol.z:
        return Check("atypical_tokens", *stats, f"z = {z:.2f} over {n} tokens")
    return Check("", *stats)
